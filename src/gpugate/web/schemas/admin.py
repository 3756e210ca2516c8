"""The operator plane's bodies (``/admin/...``): upstreams, GPUs, runtimes, the audit log."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, AwareDatetime, Field

from gpugate.store.runtime_state import RUNTIME_STATES
from gpugate.web.schemas.common import Cents, Day, Key, Query, RequestBody, Timestamp, View

MAX_AUDIT = 500
MAX_REASON = 500
_ACTOR_NAME = re.compile(r"[A-Za-z0-9._@-]{1,64}")

RuntimeStateName = Literal[RUNTIME_STATES]  # type: ignore[valid-type]


def valid_actor_name(name: str) -> bool:
    """Whether ``name`` may name an operator in the audit log (``admin:<name>``)."""
    return _ACTOR_NAME.fullmatch(name) is not None


def _actor_name(name: str) -> str:
    if not valid_actor_name(name):
        raise ValueError("expected 1-64 letters, digits, '.', '_', '@' or '-'")
    return name


ActorName = Annotated[
    str, Field(json_schema_extra={"pattern": _ACTOR_NAME.pattern}), AfterValidator(_actor_name)
]


class AdminHeaders(Query):
    """Every admin action may name its operator for the audit log."""

    actor_name: ActorName | None = Field(
        None, alias="X-Gpugate-Actor", description="recorded as `admin:<name>` in the audit log"
    )

    @property
    def actor(self) -> str:
        """Who acts, for the audit log: ``admin``, or ``admin:<name>``."""
        return "admin" if self.actor_name is None else f"admin:{self.actor_name}"


class EndpointView(View):
    url: str
    health: str = Field(examples=["healthy", "ejected", "unknown"])
    outstanding: int
    latency_ms: float | None
    ejections: int


class UpstreamView(View):
    id: str
    models: list[str]
    gpu_ids: list[int | str]
    external: bool
    out_of_rotation: str | None = Field(description="why it left rotation, if it did")
    inflight: int
    max_inflight: int
    queued: dict[str, int] = Field(description="requests waiting, by class")
    endpoints: list[EndpointView]


class UpstreamList(View):
    upstreams: list[UpstreamView]


class ExporterView(View):
    url: str
    host: str | None
    scrapes: int
    failures: int
    last_error: str | None
    seconds_since_success: float | None


class GpuRow(View):
    """One GPU (or MIG instance): the entry ``gpugate gpus inspect --json`` gives its last
    reading, with the verdict of the fault the gateway holds (a fault outlives its evidence until
    ``fault_hold_s`` or an operator's clear); then the upstreams mapped to it, ``stale``,
    ``saturated``, and ``fault_reason`` and ``faulted_since`` while a fault holds."""

    host: str | None
    gpu: int
    instance: str | None
    profile: str | None = None
    uuid: str | None = None
    model: str | None = None
    util_pct: int | float | None = Field(None, description="as the exporter wrote it: 91, 91.5")
    temp_c: int | float | None = Field(None, description="as the exporter wrote it: 55, 55.5")
    last_xid: int | None = None
    xid_counts: dict[str, int] | None = None
    clock_reasons: list[str] | None = None
    row_remap_failure: bool | int | None = None
    health: str | None = Field(None, examples=["PASS", "WARN", "FAIL"])
    pod: str | None = None
    namespace: str | None = None
    container: str | None = None
    verdict: Literal["ok", "faulted", "unknown"] = Field(
        description="`unknown`: not faulted, and the reading has no series a verdict reads"
    )
    reasons: list[str] = Field(
        description="inspect's reasons (the fault's, or why unknown, then notes), then why stale"
        " or saturated"
    )
    upstreams: list[str]
    stale: bool
    saturated: bool
    fault_reason: str | None
    faulted_since: str | None = Field(json_schema_extra={"format": "date-time"})


class GpusView(View):
    dormant: bool = Field(description="true without gpu_health: no GPU state at all")
    gpus: list[GpuRow]
    exporters: list[ExporterView]


class GpuPath(Query):
    gpu: Key = Field(description="a GPU index (`0`), or `host/0` with several exporters")


class GpuCleared(View):
    gpu: str
    cleared: list[str] = Field(description="the rows whose held fault was cleared")


class RuntimePath(Query):
    runtime: Key


class ReasonBody(RequestBody):
    """Why (optional; an empty body is no reason)."""

    reason: str = Field("", max_length=MAX_REASON)


class StateView(View):
    state: RuntimeStateName
    reason: str | None
    actor: str | None
    since: Timestamp | None


class StateChange(StateView):
    runtime: str


class AuditView(View):
    id: int
    at: Timestamp
    actor: str
    action: str
    subject: str
    detail: dict[str, Any]


class AuditList(View):
    data: list[AuditView]
    next_cursor: str | None = Field(description="pass as `cursor` for the next page")


class AuditQuery(Query):
    action: Key | None = Field(None, examples=["runtime.disabled", "config.saved"])
    subject: Key | None = Field(None, examples=["runtime:home-1", "config"])
    actor: Key | None = Field(None, examples=["admin:alice", "gateway"])
    since: AwareDatetime | None = Field(None, description="ISO-8601 with a timezone")
    limit: int = Field(100, ge=1, le=MAX_AUDIT)
    cursor: int | None = Field(None, ge=0, lt=2**63, description="the previous next_cursor")


class LastSubmitView(View):
    at: Timestamp
    job: str = Field(validation_alias="slug")
    call_id: str | None
    outcome: str
    error_code: str | None
    outcome_at: Timestamp


class RuntimeHealth(StateView):
    config_enabled: bool
    implemented: bool
    reachable: bool | None = Field(description="null where nothing probes the runtime yet")
    takes_dispatch: bool
    auto_disables: list[AuditView]
    history: list[AuditView]


class SpendDayView(View):
    day: Day
    cents: Cents


class LedgerView(View):
    id: int
    day: Day
    job: str = Field(validation_alias="slug")
    call_id: str | None
    cents: Cents
    source: Literal["estimated", "reported"]
    state: Literal["reserved", "settled", "released"]
    at: Timestamp
    settled_at: Timestamp | None


class SpendView(View):
    daily_cents: Cents | None
    estimate_cents: Cents | None
    today_cents: Cents | None
    over_budget: bool
    soft_cap: bool
    days: list[SpendDayView]
    ledger: list[LedgerView]


class RuntimeView(View):
    id: str
    kind: Literal["upstream", "push", "modal"]
    models: list[str]
    max_concurrency: int | None
    queue_depth: int
    in_flight: int
    last_submit: LastSubmitView | None
    health: RuntimeHealth
    spend: SpendView


class RuntimeList(View):
    runtimes: list[RuntimeView]
