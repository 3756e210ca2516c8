"""The jobs API's bodies and parameters (DESIGN §3): ``POST /v1/jobs`` and the job's views."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field

from gpugate.core.classes import RequestClass
from gpugate.services.idempotency import MAX_KEY_LENGTH
from gpugate.services.jobs import OPERATIONS, SLUG, JobRequest
from gpugate.services.sync_front import MAX_WAIT_S
from gpugate.store import JOB_STATES
from gpugate.web.schemas.common import Cents, Key, Query, RequestBody, View

MAX_LIST = 500


def _slug(value: str) -> str:
    if not SLUG.match(value):
        raise ValueError("slug must be 1-128 of letters, digits, '.', '_' and '-'")
    return value


# One list each, where the services keep it (a tuple in Literal[...] is its members).
Operation = Literal[OPERATIONS]  # type: ignore[valid-type]
JobState = Literal[JOB_STATES]  # type: ignore[valid-type]

Slug = Annotated[str, Field(json_schema_extra={"pattern": SLUG.pattern}), AfterValidator(_slug)]


class JobCreate(RequestBody):
    """A new job: the body of ``POST /v1/{operation}`` on an upstream serving ``model``."""

    model: Key = Field(description="a model some runtime of the chain serves")
    input: dict[str, Any] = Field(
        description="the upstream request body (a JSON object); `model` is filled in from the job"
    )
    operation: Operation = "chat/completions"
    cls: RequestClass = Field(
        RequestClass.BATCH, alias="class", strict=False, description="the job's request class"
    )
    runner: Key | None = Field(None, description="the runtime to try first (default_runtime)")
    slug: Slug | None = Field(None, description="the job's name (default: made up)")
    allow_external: bool = Field(
        default=True, description="false: never an external upstream nor a serverless runtime"
    )

    def job_request(self) -> JobRequest:
        return JobRequest(
            self.model,
            self.input,
            self.operation,
            self.cls,
            self.runner,
            self.slug,
            self.allow_external,
        )


IdempotencyKey = Annotated[
    Key,
    Field(
        max_length=MAX_KEY_LENGTH,
        description="the same key always yields the same job (200), never a second one",
    ),
]


class JobCreateHeaders(Query):
    idempotency_key: IdempotencyKey | None = Field(None, alias="Idempotency-Key")
    cache_control: str | None = Field(
        None,
        alias="Cache-Control",
        description="with `wait`: `no-cache` (or `no-store`) skips the result cache",
        max_length=MAX_KEY_LENGTH,
    )


class JobCreateQuery(Query):
    wait: float | None = Field(
        None,
        ge=0,
        description=(
            "seconds to wait for the job to finish (the synchronous front): 200 with the "
            f"finished job, else 202; more than {MAX_WAIT_S:g} is taken as {MAX_WAIT_S:g}"
        ),
    )


class JobListQuery(Query):
    state: JobState | None = None
    runner: Key | None = None
    limit: int = Field(50, ge=1, le=MAX_LIST)
    cursor: Key | None = Field(None, description="the previous page's next_cursor")


class JobPath(Query):
    slug: Key


class JobError(View):
    code: str
    message: str | None


class JobView(View):
    """A job as the API shows it; ``input`` only in ``GET /v1/jobs/{slug}``."""

    slug: str
    state: JobState
    runner: str
    model: str
    cls: str = Field(alias="class")
    operation: str
    allow_external: bool
    attempts: dict[str, int] = Field(description="submissions and failed attempts per runtime")
    submit_count: int
    rescue_count: int
    leased_by: str | None
    lease_expires_at: str | None = Field(json_schema_extra={"format": "date-time"})
    not_before: str | None = Field(json_schema_extra={"format": "date-time"})
    result: Any = Field(description="the upstream's answer once completed (unless result_ref)")
    result_ref: str | None = Field(
        description="a result too large to keep inline: read it at GET /v1/jobs/{slug}/result"
    )
    error: JobError | None
    cost_cents: Cents | None
    created_at: str = Field(json_schema_extra={"format": "date-time"})
    updated_at: str = Field(json_schema_extra={"format": "date-time"})
    finished_at: str | None = Field(json_schema_extra={"format": "date-time"})
    input: dict[str, Any] | None = None


class JobList(View):
    data: list[JobView]
    next_cursor: str | None


class JobEventView(View):
    id: int
    at: str | None = Field(json_schema_extra={"format": "date-time"})
    status: str
    error_code: str | None
    runtime: str | None
    call_id: str | None
    actor: str
    detail: dict[str, Any]


class JobEventList(View):
    data: list[JobEventView]
