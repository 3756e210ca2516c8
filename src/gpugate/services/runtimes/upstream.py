"""The ``upstream`` runtime: a job forwarded through the gateway's own synchronous path.

:meth:`UpstreamRuntime.submit` checks what it can at once — the model's upstreams in rotation,
``allow_external``, and the shed gate for ``batch`` (so a saturated GPU raises
:class:`~gpugate.errors.GpuSaturated` and the dispatcher defers the job) — and answers with a
fresh call id. The call itself is a task this runtime owns: it waits for
:meth:`~UpstreamRuntime.confirm` (the dispatcher recorded the call), sends
``POST /v1/{operation}`` with the job's ``input`` and ``model`` through :meth:`Proxy.open`
(admission, picking, one connect retry), reads the whole answer, and writes the outcome with the
job's lease token:

* 2xx → ``complete`` with the parsed JSON (the text when it is not JSON);
* a status :func:`gpugate.retry.retryable` names (429, 500, 502, 503, 504), a timeout, an
  unreachable or refused upstream → the attempt failed (retryable) and the job goes back to the
  queue, so the dispatcher retries or walks on;
* GPU_SATURATED (saturation began after the submit) → deferred, not failed;
* any other status (a 4xx, 501, 505) → the answer will not change: terminal ``fail`` with
  ``UPSTREAM_<status>``, as the push worker reports the same answer of its model server.

Every request carries ``X-Gpugate-Job: <slug>``. :meth:`status` answers from this process's
table of calls — ``unknown`` after a restart, and the reaper then takes the job back.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import re
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from gpugate.clock import Clock
from gpugate.core import tokens
from gpugate.core.classes import RequestClass
from gpugate.core.jobs import GPU_SATURATED
from gpugate.errors import (
    ClientError,
    GpugateError,
    GpuSaturated,
    NoHealthyUpstream,
    Refused,
    RuntimeRejected,
    RuntimeUnreachable,
    StoreError,
    UnknownModel,
    UpstreamError,
)
from gpugate.retry import retryable
from gpugate.services.proxy import Outbound, Proxy, json_or_text, read_all
from gpugate.services.results import Results
from gpugate.services.runtimes.base import CallStatus, Submission
from gpugate.store import JobRecord, JobStore

log = logging.getLogger("gpugate.runtimes.upstream")

JOB_HEADER = b"x-gpugate-job"
_OPERATION = re.compile(r"[A-Za-z0-9_-]+(?:/[A-Za-z0-9_-]+)*")
_MESSAGE_LIMIT = 500


@dataclass(frozen=True, slots=True)
class _Outcome:
    """How one call ended, before it is written."""

    status: CallStatus
    defer_s: float | None = None  # set: deferred (GPU_SATURATED) for this long
    size: int | None = None  # the answer's size in bytes, when there was one


@dataclass(slots=True, eq=False)
class _Call:
    call_id: str
    slug: str
    token: str
    out: Outbound
    confirmed: asyncio.Event
    status: CallStatus
    task: asyncio.Task[None] | None = None


class UpstreamRuntime:
    """Runs jobs on the gateway's own upstreams; see the module docstring."""

    kind = "upstream"
    call_lease_s: float | None = None  # jobs.quiet_s

    def __init__(  # noqa: PLR0913 - collaborators, then keyword-only knobs
        self,
        runtime_id: str,
        proxy: Proxy,
        store: JobStore,
        clock: Clock,
        *,
        on_finished: Callable[[], None] | None = None,
        shed_backoff_s: float = 15.0,
        remember: int = 1024,
        lease_s: float = 60.0,
        results: Results | None = None,
    ) -> None:
        self._id = runtime_id
        self._results = results or Results()  # Results(): every result inline
        self._proxy = proxy
        self._store = store
        self._clock = clock
        #: Called after a call's outcome is written (wiring: the dispatcher's ``slot_freed``).
        self._on_finished = on_finished
        self._shed_backoff_s = shed_backoff_s
        self._remember = remember
        self._lease_s = lease_s
        self._calls: dict[str, _Call] = {}  # calls whose task has not ended
        self._finished: OrderedDict[str, CallStatus] = OrderedDict()  # the latest ended ones
        self._tasks: set[asyncio.Task[None]] = set()
        self.completed = 0
        self.failed = 0

    @property
    def id(self) -> str:
        return self._id

    @property
    def actor(self) -> str:
        """Who this runtime's writes are recorded as in the job's events."""
        return f"worker:{self._id}"

    async def submit(self, job: JobRecord, lease_token: str) -> Submission:
        out = self._outbound(job)
        call = _Call(
            call_id=tokens.token_urlsafe(12),
            slug=job.slug,
            token=lease_token,
            out=out,
            confirmed=asyncio.Event(),
            status=CallStatus("queued"),
        )
        call.task = asyncio.create_task(self._run(call), name=f"gpugate.job.{job.slug}")
        self._tasks.add(call.task)
        call.task.add_done_callback(self._tasks.discard)
        self._calls[call.call_id] = call
        return Submission(call.call_id, running=True)

    async def confirm(self, call_id: str) -> None:
        call = self._calls.get(call_id)
        if call is not None:
            call.confirmed.set()

    async def status(self, call_id: str) -> CallStatus:
        call = self._calls.get(call_id)
        if call is not None:
            return call.status
        return self._finished.get(call_id) or CallStatus("unknown")

    async def cancel(self, call_id: str) -> None:
        call = self._calls.pop(call_id, None)
        if call is not None and call.task is not None:
            call.task.cancel()

    async def close(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    @property
    def running(self) -> int:
        """Calls whose task has not ended."""
        return len(self._calls)

    # -- submit: what can be known at once ---------------------------------------------------

    def _outbound(self, job: JobRecord) -> Outbound:
        """The request to send, with its upstream chosen when ``allow_external`` narrows it."""
        if job.input_ref is not None:
            raise RuntimeRejected(
                f"{self._id}: the job's input is held in a blob ({job.input_ref}); "
                "the upstream runtime needs it inline"
            )
        if not _OPERATION.fullmatch(job.operation):
            raise RuntimeRejected(f"{self._id}: invalid operation {job.operation!r}")
        cls = RequestClass(job.job_class)
        body = json.dumps({**job.input, "model": job.model}, separators=(",", ":")).encode()
        out = Outbound(
            method="POST",
            path=f"/v1/{job.operation}",
            headers=[
                (b"content-type", b"application/json"),
                (JOB_HEADER, job.slug.encode()),
            ],
            body=body,
            cls=cls,
            received_at=self._clock.monotonic(),
            model=job.model,
            allow_external=job.allow_external,
            rescue=False,  # the dispatcher retries and walks the chain; one try per call
        )
        try:
            upstreams = self._proxy.candidates(out)
        except UnknownModel as exc:
            raise RuntimeRejected(f"{self._id}: {exc.message}") from exc
        except NoHealthyUpstream as exc:
            raise RuntimeUnreachable(f"{self._id}: {exc.message}") from exc
        pin = False
        if not job.allow_external:
            internal = [u for u in upstreams if not u.config.external]
            if not internal:
                raise RuntimeUnreachable(
                    f"{self._id}: the job may not leave the building, and only external "
                    f"upstreams of {job.model!r} are in rotation"
                )
            pin, upstreams = len(internal) < len(upstreams), internal
        if self._proxy.gate is not None:  # raises GpuSaturated: the dispatcher defers
            upstreams = self._proxy.gate.admit(upstreams, cls, "jobs")
        if pin:  # chosen among what the gate admitted: batch goes where the GPUs have room
            chosen = min(upstreams, key=lambda u: u.pool.inflight)
            out = dataclasses.replace(out, upstream_id=chosen.id)
        return out

    # -- the call --------------------------------------------------------------------------

    async def _run(self, call: _Call) -> None:
        try:
            await self._call(call)
        except asyncio.CancelledError:
            call.status = CallStatus("unknown")  # stopped here: nobody will finish it
            raise
        except Exception:
            # A bug must not leave the call "running" for ever: record it as a failed attempt.
            log.exception("job %s: call %s broke", call.slug, call.call_id)
            call.status = CallStatus("failed", error_code="RUNTIME_FAILED", message="internal")
        finally:
            if self._calls.pop(call.call_id, None) is not None:
                self._finished[call.call_id] = call.status
                while len(self._finished) > self._remember:
                    self._finished.popitem(last=False)

    async def _call(self, call: _Call) -> None:
        await call.confirmed.wait()
        call.status = CallStatus("running")
        out = dataclasses.replace(call.out, received_at=self._clock.monotonic())
        heartbeat = asyncio.ensure_future(self._heartbeat(call))
        try:
            outcome = await self._execute(out)
        finally:
            heartbeat.cancel()
        call.status = outcome.status
        try:
            await self._write(call, outcome)
        except StoreError:
            log.exception(
                "job %s: the outcome of call %s could not be written; the reaper will ask",
                call.slug,
                call.call_id,
            )
            return
        if self._on_finished is not None:
            self._on_finished()

    async def _heartbeat(self, call: _Call) -> None:
        """Keep the call's lease alive while the upstream works on it (every third of the
        lease): only this process can answer for the call, so another replica's reaper must
        not find it expired and run it again. When this process dies, the heartbeat stops and
        the lease expires within ``lease_s``."""
        while True:
            await self._clock.sleep(self._lease_s / 3)
            try:
                extended = await self._store.extend_lease(
                    call.slug, call.token, lease_s=self._lease_s
                )
            except StoreError:
                log.warning(
                    "job %s: could not extend the lease of call %s", call.slug, call.call_id
                )
                continue
            if extended is None:  # the lease is no longer ours: someone took the job over
                return

    async def _execute(self, out: Outbound) -> _Outcome:
        """Send and read the whole answer; every way it can end, as an outcome."""
        try:
            reply = await self._proxy.open(out)
        except GpuSaturated as exc:
            self._proxy.refused(out, exc)
            return _Outcome(
                _failure(exc, retryable=True), exc.retry_after_s or self._shed_backoff_s
            )
        except (Refused, UpstreamError) as exc:
            self._proxy.refused(out, exc)
            return _Outcome(_failure(exc, retryable=True))
        except ClientError as exc:
            self._proxy.refused(out, exc)
            return _Outcome(_failure(exc, retryable=False))
        try:
            body = await read_all(reply)
        except UpstreamError as exc:
            reply.broke()
            reply.close(exc.code)
            return _Outcome(_failure(exc, retryable=True))
        finally:
            reply.close()
        return _Outcome(_answered(reply.status, body), size=len(body))

    async def _write(self, call: _Call, outcome: _Outcome) -> None:
        status, store = outcome.status, self._store
        if status.state == "completed":
            written = await self._results.complete(
                store,
                call.slug,
                call.token,
                status.result,
                actor=self.actor,
                size_hint=outcome.size,
            )
            self.completed += written
        elif status.terminal:
            code, message = status.error_code or "UPSTREAM_ERROR", status.message or ""
            written = await store.fail(
                call.slug, call.token, error_code=code, message=message, actor=self.actor
            )
            self.failed += written
        elif outcome.defer_s is not None:
            not_before = self._clock.now() + timedelta(seconds=outcome.defer_s)
            written = await store.release(
                call.slug,
                call.token,
                not_before=not_before,
                status="deferred",
                error_code=GPU_SATURATED,
                actor=self.actor,
            )
        else:
            code = status.error_code or "UPSTREAM_ERROR"
            written = await store.record_attempt_failure(
                call.slug,
                call.token,
                runtime=self._id,
                error_code=code,
                message=status.message or "",
                retryable=status.retryable,
                actor=self.actor,
            ) and await store.release(call.slug, call.token, error_code=code, actor=self.actor)
        if not written:
            log.info("job %s: call %s ended after its lease was lost", call.slug, call.call_id)

    def __repr__(self) -> str:
        return (
            f"<UpstreamRuntime {self._id} running={self.running} "
            f"completed={self.completed} failed={self.failed}>"
        )


def _failure(exc: GpugateError, *, retryable: bool) -> CallStatus:
    return CallStatus("failed", error_code=exc.code, message=exc.message, retryable=retryable)


def _answered(status: int, body: bytes) -> CallStatus:
    """The call's end from the upstream's status and body."""
    if 200 <= status < 300:
        return CallStatus("completed", result=json_or_text(body))
    code = f"UPSTREAM_{status}"
    message = f"the upstream answered {status}: {_error_message(body)}"
    if retryable(status):
        return CallStatus("failed", error_code=code, message=message, retryable=True)
    return CallStatus("failed", error_code=code, message=message, retryable=False, terminal=True)


def _error_message(body: bytes) -> str:
    """The message of an OpenAI-shaped error body, else the start of the body."""
    parsed = json_or_text(body)
    if isinstance(parsed, dict):
        error = parsed.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return str(error["message"])[:_MESSAGE_LIMIT]
        if isinstance(error, str):
            return error[:_MESSAGE_LIMIT]
    text = parsed if isinstance(parsed, str) else body.decode("utf-8", errors="replace")
    return text[:_MESSAGE_LIMIT] or "(empty body)"
