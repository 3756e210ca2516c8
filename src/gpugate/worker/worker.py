"""The push worker's calls: accepted, claimed, run, reported — and kept until reported.

For each accepted push the worker runs one task:

1. ``claimed`` to the gateway (retried until the gateway answers: a refusal drops the call —
   the job has moved on — and nothing runs);
2. the model request, while a side task extends the lease every third of ``lease_s`` (a
   refused extension means the job was taken back: the request is cancelled);
3. the outcome becomes a :class:`~gpugate.worker.calls.FinalReport`, written to the
   :class:`~gpugate.worker.outbox.Outbox` **before** it is sent, and sent until the gateway
   settles it; only then is it forgotten on disk.

A worker that restarts reads the reports left in its outbox and sends them again; the calls
it was running are gone (the gateway's reaper finds them ``unknown`` and the jobs walk on).
``GET /calls/{id}`` answers from the same table, so the reaper's backstop can complete a job
from a report the gateway has not taken yet.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import secrets
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpugate import push_signature
from gpugate.worker.calls import Call, Push
from gpugate.worker.links import Links
from gpugate.worker.outbox import Outbox

log = logging.getLogger("gpugate.worker")

ACTIVE = frozenset({"queued", "running"})
DEFAULT_LEASE_S = 60.0


class WorkerBusy(Exception):
    """Every slot (``--concurrency``) runs a call."""


@dataclass(frozen=True, slots=True)
class WorkerSettings:
    """What ``gpugate worker`` is told on its command line."""

    runtime_id: str
    secret: str
    gateway_url: str
    upstream_url: str
    state_dir: Path
    concurrency: int = 1
    idle_exit_s: float | None = None
    remember: int = 1024
    auth: str = "signed"  # or "bearer": a wave-1 gateway (the secret as a bearer token)
    tls_cert_file: Path | None = None  # serve /calls over TLS (and present it to an mTLS gateway)
    tls_key_file: Path | None = None
    tls_client_ca_file: Path | None = None  # require the gateway's client certificate
    gateway_ca_file: Path | None = None  # trust this CA for an https:// gateway


class Worker:
    """The calls of one push worker; see the module docstring."""

    def __init__(self, settings: WorkerSettings, links: Links, outbox: Outbox) -> None:
        self.settings = settings
        self._links = links
        self._outbox = outbox
        self._secret = settings.secret.encode()
        self._key = push_signature.derive_key(settings.secret, push_signature.GATEWAY_TO_WORKER)
        self._answer_key = push_signature.derive_key(
            settings.secret, push_signature.WORKER_TO_GATEWAY
        )
        self._nonces = push_signature.NonceCache()
        self._calls: OrderedDict[str, Call] = OrderedDict()
        self._by_lease: dict[tuple[str, str], str] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._idle_since = time.monotonic()
        self._changed = asyncio.Event()
        self.completed = 0
        self.failed = 0
        self.dropped = 0

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> int:
        """Open the outbox and send again every report a previous run left; how many."""
        self._outbox.open()
        left = self._outbox.pending()
        for report in left:
            call = Call.finished(report)
            self._remember(call)
            self._spawn(call, self._send(call))
        if left:
            log.info("outbox: sending %d report(s) left by a previous run", len(left))
        return len(left)

    async def close(self) -> None:
        """Stop every task; reports already written stay in the outbox for the next run."""
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def idle_exit(self) -> None:
        """Return once nothing ran and nothing waited to be sent for ``idle_exit_s``; never
        without ``idle_exit_s``."""
        limit = self.settings.idle_exit_s
        if limit is None:
            await asyncio.Event().wait()
            return
        while True:
            self._changed.clear()
            if not self._tasks:
                left = limit - (time.monotonic() - self._idle_since)
                if left <= 0:
                    return
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), timeout=left)
            else:
                await self._changed.wait()

    # -- the push protocol -----------------------------------------------------------------

    def admit(
        self, method: str, target: str, body: bytes, headers: Mapping[str, str]
    ) -> str | None:
        """Whether the gateway sent this request: its signature (the request's nonce, to sign
        the answer with), or with ``auth="bearer"`` its bearer secret (None);
        :class:`~gpugate.push_signature.BadSignature` otherwise, replays included."""
        if self.settings.auth == "bearer":
            scheme, _, offered = headers.get("Authorization", "").partition(" ")
            if scheme.lower() == "bearer" and hmac.compare_digest(
                offered.strip().encode(), self._secret
            ):
                return None
            raise push_signature.BadSignature("missing or wrong runtime secret")
        now = time.time()
        _, signed = push_signature.verify_request(
            [(self.settings.runtime_id, self._key)],
            push_signature.GATEWAY_TO_WORKER,
            headers.get(push_signature.HEADER),
            method=method,
            target=target,
            body=body,
            lease_token=None,
            now=now,
        )
        if not self._nonces.admit(signed, now):
            raise push_signature.BadSignature("a replayed request (its nonce was seen)")
        return signed.nonce

    def sign_answer(self, nonce: str, status: int, body: bytes) -> str:
        """The signature of this worker's answer to the request with ``nonce``."""
        return push_signature.sign_response(
            self._answer_key,
            push_signature.WORKER_TO_GATEWAY,
            request_nonce=nonce,
            status=status,
            body=body,
        )

    def accept(self, push: Push) -> str:
        """Take the call and start it; the call id. The same job and lease token again (a
        submit retried by the gateway) is the same call."""
        known = self._by_lease.get((push.slug, push.lease_token))
        if known is not None and known in self._calls:
            return known
        if self.active >= self.settings.concurrency:
            raise WorkerBusy
        call = Call(secrets.token_urlsafe(12), push.slug, push.lease_token, push=push)
        self._remember(call)
        self._by_lease[(push.slug, push.lease_token)] = call.call_id
        self._spawn(call, self._drive(call))
        return call.call_id

    def status(self, call_id: str) -> dict[str, Any] | None:
        call = self._calls.get(call_id)
        return call.view() if call is not None else None

    def cancel(self, call_id: str) -> bool:
        """Stop the call and forget it, its report included; False for an unknown call."""
        call = self._calls.pop(call_id, None)
        if call is None:
            return False
        self._by_lease.pop((call.slug, call.lease_token), None)
        task = self._tasks.get(call_id)
        if task is not None:
            task.cancel()
        self._outbox.forget(call_id)
        log.info("call %s (job %s) cancelled by the gateway", call_id, call.slug)
        return True

    @property
    def active(self) -> int:
        """Calls queued or running (what ``--concurrency`` limits)."""
        return sum(1 for call in self._calls.values() if call.state in ACTIVE)

    # -- one call --------------------------------------------------------------------------

    async def _drive(self, call: Call) -> None:
        assert call.push is not None
        claimed = await self._links.deliver(
            "POST", f"/v1/jobs/{call.slug}/claimed", call.lease_token
        )
        if not claimed.taken:
            self._drop(call, f"claimed was refused: {claimed.describe()}")
            return
        call.state = "running"
        lease_s = _lease_s(claimed.body)
        extender = asyncio.create_task(self._extend(call, lease_s, asyncio.current_task()))
        try:
            report = await self._links.run(call.call_id, call.push)
        finally:
            extender.cancel()
            await asyncio.gather(extender, return_exceptions=True)
        self._outbox.keep(report)
        call.report, call.state = report, report.state
        await self._send(call)

    async def _extend(self, call: Call, lease_s: float, drive: asyncio.Task[Any] | None) -> None:
        path = f"/v1/jobs/{call.slug}/lease"
        while True:
            await asyncio.sleep(lease_s / 3)
            answer = await self._links.report("POST", path, call.lease_token)
            if answer.refused:
                self._drop(call, f"the lease was refused: {answer.describe()}")
                if drive is not None:
                    drive.cancel()
                return
            if not answer.taken:
                log.warning("job %s: lease not extended (%s)", call.slug, answer.describe())

    async def _send(self, call: Call) -> None:
        report = call.report
        assert report is not None
        answer = await self._links.deliver(
            report.method, report.path, report.lease_token, report.body
        )
        if answer.taken:
            call.delivered = True
            if report.kind == "result":
                self.completed += 1
            else:
                self.failed += 1
        else:  # 409 is routine: the reaper completed the job from GET /calls/{id} first
            log.log(
                logging.INFO if answer.status == 409 else logging.WARNING,
                "job %s: the gateway refused the report of call %s (%s); dropping it",
                call.slug,
                call.call_id,
                answer.describe(),
            )
            self.dropped += 1
        self._outbox.forget(call.call_id)

    def _drop(self, call: Call, why: str) -> None:
        log.info("job %s: call %s dropped: %s", call.slug, call.call_id, why)
        self.dropped += 1
        self._calls.pop(call.call_id, None)
        self._by_lease.pop((call.slug, call.lease_token), None)

    # -- bookkeeping -----------------------------------------------------------------------

    def _spawn(self, call: Call, work: Any) -> None:
        task = asyncio.create_task(self._guarded(call, work), name=f"gpugate.worker.{call.slug}")
        self._tasks[call.call_id] = task
        self._changed.set()

        def done(_: asyncio.Task[None]) -> None:
            if self._tasks.get(call.call_id) is task:
                del self._tasks[call.call_id]
            if not self._tasks:
                self._idle_since = time.monotonic()
            self._changed.set()

        task.add_done_callback(done)

    async def _guarded(self, call: Call, work: Any) -> None:
        try:
            await work
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("job %s: call %s broke", call.slug, call.call_id)
            self._drop(call, "internal error")

    def _remember(self, call: Call) -> None:
        self._calls[call.call_id] = call
        while len(self._calls) > self.settings.remember:
            oldest = next(
                (
                    cid
                    for cid, c in self._calls.items()
                    if c.state not in ACTIVE and cid not in self._tasks
                ),
                None,
            )
            if oldest is None:
                break
            old = self._calls.pop(oldest)
            self._by_lease.pop((old.slug, old.lease_token), None)

    def __repr__(self) -> str:
        return (
            f"<Worker {self.settings.runtime_id} active={self.active} tasks={len(self._tasks)} "
            f"completed={self.completed} failed={self.failed} dropped={self.dropped}>"
        )


def _lease_s(body: Any) -> float:
    value = body.get("lease_s") if isinstance(body, dict) else None
    if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
        return float(value)
    return DEFAULT_LEASE_S
