"""The ``push`` runtime: a home or local machine running the push worker (``gpugate worker``).

The gateway side of the push protocol (DESIGN §3). :meth:`PushRuntime.submit` sends
``POST {push.url}`` with ``{slug, model, class, operation, input, lease_token, gateway_url,
deadline}`` and ``Authorization: Bearer <the runtime's secret>``; the worker answers
``202 {"call_id"}`` and from then on drives the job itself through the worker routes
(:class:`~gpugate.services.runtimes.push_reports.PushReports`): ``claimed`` makes it
``running`` — a push call is not running from submit — then lease extensions, then the result or
the failure.

Submit refusals map to the runtime errors the dispatcher walks by: 429 →
:class:`RuntimeBusy`, 401/403 → :class:`RuntimeAuthFailed`, any other status
:func:`gpugate.retry.retryable` names (a transient 5xx, 408) or no answer →
:class:`RuntimeUnreachable` / :class:`RuntimeTimeout`, and every other status (a 4xx, 501) →
:class:`RuntimeRejected`.

:meth:`PushRuntime.status` (``GET {push.url}/{call_id}``) is the reaper's backstop, asked only
for calls quiet longer than ``jobs.quiet_s``. A worker that answers 404, or whose port refuses
the connection (nothing runs there: the process died), has no such call — ``unknown``, and the
reaper takes the job back. A worker that cannot be reached otherwise (a timeout, a network
failure) may still be running the call: the status raises, and the reaper keeps the call.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any
from urllib.parse import quote

from gpugate.adapters.push_client import PushClient
from gpugate.clock import Clock
from gpugate.errors import (
    RuntimeAuthFailed,
    RuntimeBusy,
    RuntimeFailure,
    RuntimeRefused,
    RuntimeRejected,
    RuntimeUnreachable,
)
from gpugate.retry import retryable
from gpugate.services.runtimes.base import CALL_STATES, CallStatus, Submission, job_payload
from gpugate.store import JobRecord

log = logging.getLogger("gpugate.runtimes.push")

_MESSAGE_LIMIT = 500
_HTTP_OK_MAX = 299


def call_cost(
    cost_cents: float | None, duration_s: float | None, cents_per_second: float | None
) -> float | None:
    """What a call cost: the reported ``cost_cents``, else ``duration_s`` x the runtime's
    ``budget.cents_per_second``, else unknown (None)."""
    if cost_cents is not None:
        return cost_cents
    if duration_s is not None and cents_per_second is not None:
        return duration_s * cents_per_second
    return None


class PushRuntime:
    """One ``kind: push`` runtime: its worker's address and secret; see the module docstring."""

    kind = "push"
    call_lease_s: float | None = None  # jobs.quiet_s

    def __init__(  # noqa: PLR0913 - the runtime's identity, then keyword-only knobs
        self,
        runtime_id: str,
        url: str,
        secret: str,
        client: PushClient,
        clock: Clock,
        *,
        gateway_url: str,
        cents_per_second: float | None = None,
        deadline_s: float = 3600.0,
        submit_timeout_s: float = 10.0,
        status_timeout_s: float = 5.0,
    ) -> None:
        self._id = runtime_id
        self._url = url.rstrip("/")
        self._secret = secret
        self._client = client
        self._clock = clock
        self._gateway_url = gateway_url
        self._cents_per_second = cents_per_second
        self._deadline_s = deadline_s
        self._submit_timeout_s = submit_timeout_s
        self._status_timeout_s = status_timeout_s
        self.submitted = 0

    @property
    def id(self) -> str:
        return self._id

    @property
    def url(self) -> str:
        return self._url

    async def submit(self, job: JobRecord, lease_token: str) -> Submission:
        deadline = self._clock.now() + timedelta(seconds=self._deadline_s)
        payload = {
            **job_payload(self._id, job, "a push worker"),
            "lease_token": lease_token,
            "gateway_url": self._gateway_url,
            "deadline": deadline.isoformat(),
        }
        status, body = await self._client.request(
            "POST", self._url, secret=self._secret, body=payload, timeout_s=self._submit_timeout_s
        )
        if status > _HTTP_OK_MAX:
            raise self._refusal(status, body)
        call_id = body.get("call_id") if isinstance(body, dict) else None
        if not isinstance(call_id, str) or not call_id or "/" in call_id:
            raise RuntimeRejected(f"{self._id}: the worker accepted the call without a call_id")
        self.submitted += 1
        return Submission(call_id, running=False)

    async def confirm(self, call_id: str) -> None:
        """Nothing to do: the worker starts at once and reports ``claimed`` itself (a call the
        gateway could not record is cancelled, and its reports are refused by the lease)."""

    async def status(self, call_id: str) -> CallStatus:
        try:
            status, body = await self._client.request(
                "GET",
                self._call_url(call_id),
                secret=self._secret,
                timeout_s=self._status_timeout_s,
            )
        except RuntimeRefused:
            return CallStatus("unknown")  # nothing listens: the worker process is gone
        if status == 404:
            return CallStatus("unknown")
        if status > _HTTP_OK_MAX:
            raise self._refusal(status, body)
        return self._call_status(body)

    async def cancel(self, call_id: str) -> None:
        try:
            await self._client.request(
                "DELETE",
                self._call_url(call_id),
                secret=self._secret,
                timeout_s=self._status_timeout_s,
            )
        except RuntimeFailure as exc:
            log.warning("%s: could not cancel call %s: %s", self._id, call_id, exc)

    async def close(self) -> None:
        """Nothing runs in this process: the worker's calls go on and report to any replica."""

    def _call_url(self, call_id: str) -> str:
        return f"{self._url}/{quote(call_id, safe='')}"

    def _refusal(self, status: int, body: Any) -> RuntimeFailure:
        message = f"{self._id}: the worker answered {status}: {_error_message(body)}"
        if status == 429:
            return RuntimeBusy(message, retry_after_s=None)
        if status in (401, 403):
            return RuntimeAuthFailed(message)
        if retryable(status):
            return RuntimeUnreachable(message)
        return RuntimeRejected(message)

    def _call_status(self, body: Any) -> CallStatus:
        """The worker's ``{"state", ...}`` as a :class:`CallStatus`; garbage cannot say."""
        state = body.get("state") if isinstance(body, dict) else None
        if state not in CALL_STATES:
            raise RuntimeUnreachable(f"{self._id}: the worker's status has no valid state")
        assert isinstance(body, dict)
        if state == "completed":
            cost = call_cost(
                _number(body.get("cost_cents")),
                _number(body.get("duration_s")),
                self._cents_per_second,
            )
            return CallStatus("completed", result=body.get("result"), cost_cents=cost)
        if state == "failed":
            again = body.get("retryable", True) is not False
            return CallStatus(
                "failed",
                error_code=str(body.get("error_code") or "WORKER_FAILED")[:64],
                message=str(body.get("message") or "")[:_MESSAGE_LIMIT],
                retryable=again,
                terminal=not again,
            )
        return CallStatus(state)

    def __repr__(self) -> str:
        return f"<PushRuntime {self._id} url={self._url} submitted={self.submitted}>"


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        return None
    return float(value)


def _error_message(body: Any) -> str:
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return str(error["message"])[:_MESSAGE_LIMIT]
        if isinstance(error, str):
            return error[:_MESSAGE_LIMIT]
    return "(no error message)"
