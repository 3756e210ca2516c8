"""The worker routes' bodies (DESIGN §3), for :mod:`gpugate.web.worker`.

``PATCH /v1/jobs/{slug}`` takes a :class:`ReportBody`, ``POST /v1/jobs/{slug}/fail`` a
:class:`FailureBody` (both refuse unknown keys); ``report()`` and ``failure()`` give what
:class:`~gpugate.services.runtimes.push_reports.PushReports` takes. Every route answers a
:class:`WorkerAnswer`.
"""

from __future__ import annotations

from typing import Any, Self

from pydantic import Field, model_validator

from gpugate.services.runtimes.push_reports import Failure, Report
from gpugate.web.schemas.common import MAX_KEY_LENGTH, Key, Query, RequestBody, View
from gpugate.web.schemas.jobs import JobState

MESSAGE_LIMIT = 2000


class WorkerHeaders(Query):
    signature: str | None = Field(
        None,
        alias="X-Gpugate-Signature",
        description="push.auth signed (the default): the HMAC over the method, path, lease token "
        "and body digest with the runtime's worker-to-gateway key",
    )
    lease_token: str | None = Field(
        None,
        alias="X-Lease-Token",
        max_length=MAX_KEY_LENGTH,
        description="the lease_token the call was pushed with",
    )


class WorkerPath(Query):
    slug: Key


class ReportBody(RequestBody):
    """Progress, or the result (the job completes); at least one of the two."""

    progress: dict[str, Any] | None = Field(None, description="appended as a progress event")
    result: Any = Field(None, description="the job's result: sending it completes the job")
    cost_cents: float | None = Field(None, ge=0, description="what the call cost, if known")
    duration_s: float | None = Field(
        None, ge=0, description="else the cost is duration_s x the budget's cents_per_second"
    )

    @model_validator(mode="after")
    def _result_or_progress(self) -> Self:
        if self.progress is None and "result" not in self.model_fields_set:
            raise ValueError("a report needs a result or a progress object")
        return self

    def report(self) -> Report:
        return Report(
            progress=self.progress,
            has_result="result" in self.model_fields_set,
            result=self.result,
            cost_cents=self.cost_cents,
            duration_s=self.duration_s,
        )


class FailureBody(RequestBody):
    """The call failed; retryable: the job walks on along its chain, else it fails for good."""

    error_code: str = Field(pattern=r"^[A-Z][A-Z0-9_]{0,63}$")
    message: str = ""
    retryable: bool = True

    def failure(self) -> Failure:
        return Failure(self.error_code, self.message[:MESSAGE_LIMIT], self.retryable)


class WorkerAnswer(View):
    slug: str
    state: JobState
    lease_s: float | None = Field(None, description="claimed, lease: extend every third of it")
    lease_expires_at: str | None = Field(None, json_schema_extra={"format": "date-time"})
    cost_cents: float | None = Field(None, description="a report with a result: what it cost")


WORKER_ERRORS = {
    400: "BAD_REQUEST: no X-Lease-Token, or a malformed body",
    401: "UNAUTHORIZED: no push runtime's signature (or secret), or a replay",
    403: "WRONG_RUNTIME: the job is leased to another runtime",
    404: "JOB_NOT_FOUND",
    409: "LEASE_TOKEN_STALE: the token is not the lease's; drop the call",
}
