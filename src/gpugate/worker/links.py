"""The worker's outbound HTTP, on one pooled aiohttp session: its reports to the gateway and its
requests to the local model server.

Reports (:meth:`Links.deliver`) are retried with a full-jitter exponential backoff
(:class:`gpugate.retry.Backoff`, so the workers of a fleet do not come back in step after a
gateway restart) for as long as the gateway gives no answer that settles them — it is down,
restarting, overloaded (no answer, or a status :func:`gpugate.retry.retryable` names) — and stop
at the first that does: 2xx (taken) or any other status (refused for good: a stale lease,
another runtime's job, an unknown job). A worker therefore survives a gateway restart without
losing a report: there is no cap on the tries, only on the wait between two (``max_backoff_s``),
because the report is the call's only way home (its lease is fenced: a late one is refused,
never applied twice).

Signed (the default): each report is signed with the worker-to-gateway key derived from the
secret (:mod:`gpugate.push_signature`), lease token included, and the gateway's answer must be
signed for that very request with the gateway-to-worker key — an answer that is not (forged, or
from something else listening there) counts as no answer, and the report is sent again. With
``auth="bearer"`` (a wave-1 gateway) the secret goes as a bearer token and answers are taken as
they come.
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import aiohttp
from yarl import URL

from gpugate import push_signature
from gpugate.retry import Backoff, retryable
from gpugate.worker.calls import FinalReport, Push, answered, failed

log = logging.getLogger("gpugate.worker.links")

JOB_HEADER = "X-Gpugate-Job"
LEASE_HEADER = "X-Lease-Token"


@dataclass(frozen=True, slots=True)
class Answer:
    """The gateway's answer to one report; ``status`` 0 when none came (``error`` says why)."""

    status: int
    body: Any = None
    error: str = ""

    @property
    def taken(self) -> bool:
        return 200 <= self.status < 300

    @property
    def refused(self) -> bool:
        """Refused for good: sending it again cannot help."""
        return self.status != 0 and not self.taken and not retryable(self.status)

    @property
    def settled(self) -> bool:
        return self.taken or self.refused

    def describe(self) -> str:
        if self.status == 0:
            return self.error
        error = self.body.get("error") if isinstance(self.body, dict) else None
        if isinstance(error, dict):
            return f"{self.status} {error.get('code')}: {error.get('message')}"
        return str(self.status)


class Links:
    """The gateway at ``gateway_url`` (reports carry ``secret``) and the model server at
    ``upstream_url``."""

    def __init__(  # noqa: PLR0913 - the three addresses, then keyword-only knobs
        self,
        gateway_url: str,
        secret: str,
        upstream_url: str,
        *,
        report_timeout_s: float = 10.0,
        backoff_s: float = 0.2,
        max_backoff_s: float = 5.0,
        max_call_s: float = 3600.0,
        auth: str = "signed",
        gateway_tls: ssl.SSLContext | None = None,
        runtime_id: str | None = None,
    ) -> None:
        self._gateway = gateway_url.rstrip("/")
        self._secret = secret
        self._auth = auth
        self._gateway_tls = gateway_tls
        self._runtime_id = runtime_id  # the key hint of signed reports
        self._from_gateway = push_signature.derive_key(secret, push_signature.GATEWAY_TO_WORKER)
        self._upstream = upstream_url.rstrip("/")
        self._report_timeout = aiohttp.ClientTimeout(total=report_timeout_s)
        self._backoff = Backoff(backoff_s, max_backoff_s)
        self._max_call_s = max_call_s
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None))

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    # -- the gateway -----------------------------------------------------------------------

    async def report(
        self, method: str, path: str, token: str, body: dict[str, Any] | None = None
    ) -> Answer:
        """One attempt at a report."""
        assert self._session is not None, "Links.start() was not awaited"
        target = URL(self._gateway + path)
        data = b"" if body is None else json.dumps(body).encode()
        headers, nonce = push_signature.credentials(
            self._secret,
            push_signature.WORKER_TO_GATEWAY,
            self._auth,
            method=method,
            target=target.raw_path_qs,
            body=data,
            lease_token=token,
            key_id=self._runtime_id,
        )
        headers[LEASE_HEADER] = token
        if body is not None:
            headers["Content-Type"] = "application/json"
        try:
            async with self._session.request(
                method,
                target,
                data=data or None,
                headers=headers,
                timeout=self._report_timeout,
                ssl=self._gateway_tls if self._gateway_tls is not None else True,
            ) as resp:
                raw = await resp.read()
                if nonce is not None and not self._authentic(resp, raw, nonce):
                    return Answer(0, error=f"the gateway's {resp.status} answer is not signed")
                return Answer(resp.status, _json_or_none(raw))
        except (TimeoutError, aiohttp.ClientError) as exc:
            return Answer(0, error=f"{type(exc).__name__}: {exc}")

    def _authentic(self, resp: aiohttp.ClientResponse, raw: bytes, nonce: str) -> bool:
        return push_signature.response_valid(
            self._from_gateway,
            push_signature.GATEWAY_TO_WORKER,
            resp.headers.get(push_signature.HEADER),
            request_nonce=nonce,
            status=resp.status,
            body=raw,
        )

    async def deliver(
        self, method: str, path: str, token: str, body: dict[str, Any] | None = None
    ) -> Answer:
        """:meth:`report` until the gateway settles it (taken or refused for good)."""
        failures = 0
        while True:
            answer = await self.report(method, path, token, body)
            if answer.settled:
                return answer
            failures += 1
            delay = self._backoff.delay(failures)
            log.warning("%s %s: %s; again in %.1f s", method, path, answer.describe(), delay)
            await asyncio.sleep(delay)

    # -- the model server ------------------------------------------------------------------

    async def run(self, call_id: str, push: Push) -> FinalReport:
        """``POST {upstream}/v1/{operation}`` with the job's input and model, until the deadline;
        every way it can end, as the call's final report."""
        assert self._session is not None, "Links.start() was not awaited"
        timeout_s = self._max_call_s
        if push.deadline is not None:
            timeout_s = min(timeout_s, (push.deadline - datetime.now(UTC)).total_seconds())
        if timeout_s <= 0:
            return failed(
                call_id, push, "DEADLINE_EXCEEDED", "the call's deadline passed", retryable=True
            )
        started = time.monotonic()
        try:
            async with self._session.post(
                f"{self._upstream}/v1/{push.operation}",
                json={**push.input, "model": push.model},
                headers={JOB_HEADER: push.slug},
                timeout=aiohttp.ClientTimeout(total=timeout_s),
            ) as resp:
                body = await resp.read()
                return answered(call_id, push, resp.status, body, time.monotonic() - started)
        except TimeoutError:
            message = f"the model server did not answer within {timeout_s:.0f} s"
            return failed(call_id, push, "UPSTREAM_TIMEOUT", message, retryable=True)
        except aiohttp.ClientError as exc:
            message = f"the model server at {self._upstream} failed: {exc}"
            return failed(call_id, push, "UPSTREAM_UNREACHABLE", message, retryable=True)

    def __repr__(self) -> str:
        return f"<Links gateway={self._gateway} upstream={self._upstream}>"


def _json_or_none(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return None
