"""What each job operation does to a job, decided by pure functions (the job domain's rules).

The store reads the row under its lock (SQLite: inside ``BEGIN IMMEDIATE``; PostgreSQL:
``SELECT ... FOR UPDATE``, which a concurrent writer waits on and re-checks), asks a function here
for the :class:`Change`, and writes the change and its event in the same transaction. So the
rules of the lifecycle live in one place, outside the store; every move of state is one that
:data:`~gpugate.core.job_states.TRANSITIONS` allows.

The one exception is the PostgreSQL batch claim, a single statement (lessons §2-3): it writes
what :func:`claim` decides, in SQL, and the contract suite checks that both agree.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from datetime import datetime, timedelta
from typing import Any

from gpugate.core import tokens
from gpugate.core.job_states import (
    JOB_EVENT_STATUSES,
    LEASE_LOST,
    JobRecord,
    check_actor,
    check_runtime,
    check_transition,
)
from gpugate.core.lease import NO_LEASE_COLUMNS, Lease

CLAIM_ACTOR = "dispatcher"
"""The actor of the ``dispatching`` event of a claim."""

CREATE_ACTOR = "api"
"""The actor of the ``queued`` event of a new job."""

RELEASE_STATUSES = frozenset({"released", "deferred"})

JOB_FIELDS = tuple(f.name for f in fields(JobRecord))
"""The fields of :class:`JobRecord`, in order: a row of :data:`JOB_COLUMNS` builds one."""

JOB_COLUMNS = tuple("class" if name == "job_class" else name for name in JOB_FIELDS)
"""The columns of ``jobs``, in the order of :data:`JOB_FIELDS`."""

WRITABLE_FIELDS = frozenset(
    {
        "runner",
        "state",
        "attempts",
        "submit_count",
        "rescue_count",
        "leased_by",
        "lease_kind",
        "lease_runtime",
        "lease_call_id",
        "lease_replica",
        "lease_token",
        "lease_expires_at",
        "not_before",
        "result",
        "result_ref",
        "error_code",
        "error_message",
        "cost_cents",
        "updated_at",
        "finished_at",
    }
)
"""The :class:`JobRecord` fields an operation may change (each named like its column)."""

EVENT_COLUMNS = ("job_id", "at", "status", "actor", "runtime", "call_id", "error_code", "detail")
"""The columns a stored :class:`EventDraft` fills."""

JSON_FIELDS = frozenset({"input", "attempts", "result"})
TIME_FIELDS = frozenset(
    {"lease_expires_at", "not_before", "created_at", "updated_at", "finished_at"}
)

_NO_LEASE: dict[str, Any] = {"leased_by": None, "lease_token": None, "lease_expires_at": None}
_NO_LEASE |= NO_LEASE_COLUMNS


def new_slug() -> str:
    """``job_`` and 20 url-safe random characters."""
    return "job_" + tokens.token_urlsafe(15)


def new_lease_tokens(count: int) -> list[str]:
    """``count`` fresh fencing tokens (one per lease, 128 random bits each) from one read of
    the system's randomness (:mod:`gpugate.core.tokens`)."""
    raw = tokens.token_bytes(16 * count)
    return [
        base64.urlsafe_b64encode(raw[n : n + 16]).rstrip(b"=").decode()
        for n in range(0, len(raw), 16)
    ]


def check_lease_s(lease_s: float) -> float:
    if not lease_s > 0:
        raise ValueError(f"lease_s must be positive, got {lease_s}")
    return lease_s


@dataclass(frozen=True, slots=True)
class EventDraft:
    """A job event before it is stored (the backend adds the job, the time and the id)."""

    status: str
    actor: str
    runtime: str | None = None
    call_id: str | None = None
    error_code: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.status not in JOB_EVENT_STATUSES:
            raise ValueError(f"unknown job event status {self.status!r}")
        check_actor(self.actor)


@dataclass(frozen=True, slots=True)
class Change:
    """The fields an operation sets (all in :data:`WRITABLE_FIELDS`) and the event it appends;
    ``then``: a second event of the same write (a submit that makes the job ``running``
    appends ``submitted``, then ``running``)."""

    values: dict[str, Any]
    event: EventDraft | None = None
    then: EventDraft | None = None

    def __post_init__(self) -> None:
        unknown = set(self.values) - WRITABLE_FIELDS
        if unknown:
            raise ValueError(f"a job change may not set {sorted(unknown)}")
        if self.event is not None and "updated_at" not in self.values:
            raise ValueError("a job change with an event is a change: it sets updated_at")
        if self.then is not None and self.event is None:
            raise ValueError("a job change's second event follows a first one")

    @property
    def events(self) -> tuple[EventDraft, ...]:
        """The events this change appends, in order."""
        if self.event is None:
            return ()
        return (self.event,) if self.then is None else (self.event, self.then)

    def of(self, job: JobRecord) -> Change:
        """This change, checked to be a move :data:`TRANSITIONS` allows from ``job``'s state."""
        if "state" in self.values:
            check_transition(job.state, self.values["state"])
        return self


UNCHANGED = Change({})
"""The operation applies but there is nothing to write (e.g. a repeated ``claimed``)."""


def created_event(runner: str) -> EventDraft:
    return EventDraft("queued", CREATE_ACTOR, runtime=runner)


def claim(job: JobRecord, *, now: datetime, lease_s: float, token: str, replica: str) -> Change:
    """``queued -> dispatching`` under a fresh claim of ``replica``'s dispatcher."""
    lease = Lease.claim(replica)
    values = {
        "state": "dispatching",
        "leased_by": lease.text(job.slug),
        "lease_token": token,
        "lease_expires_at": now + timedelta(seconds=lease_s),
        "updated_at": now,
    } | lease.columns()
    event = EventDraft("dispatching", CLAIM_ACTOR, runtime=job.runner)
    return Change(values, event).of(job)


def promote(job: JobRecord, *, now: datetime, runtime: str, actor: str, why: str = "") -> Change:
    if runtime == job.runner:
        return UNCHANGED
    detail = {"from": job.runner, "why": why[:200]} if why else {"from": job.runner}
    event = EventDraft("walked", actor, runtime=runtime, detail=detail)
    return Change({"runner": check_runtime(runtime), "updated_at": now}, event)


def submit(  # noqa: PLR0913 - the job, then what the runtime's acceptance records
    job: JobRecord,
    *,
    now: datetime,
    runtime: str,
    call_id: str,
    lease_s: float,
    running: bool,
    actor: str,
    replica: str | None = None,
) -> Change:
    submit_count = job.submit_count + 1
    lease = Lease.of_call(check_runtime(runtime), call_id, replica)
    values = lease.columns() | {
        "leased_by": lease.text(job.slug),
        "submit_count": submit_count,
        "attempts": _count_attempt(job.attempts, runtime),
        "lease_expires_at": now + timedelta(seconds=check_lease_s(lease_s)),
        "state": "running" if running else job.state,
        "updated_at": now,
    }
    detail = {"submit_count": submit_count, "running": running}
    submitted = EventDraft("submitted", actor, runtime, call_id, detail=detail)
    # running from submit (upstream, serverless): the transition's own event, as a push call's
    # ``claimed`` appends one (DESIGN §5: every transition appends an event with its status)
    starts = running and job.state != "running"
    started = EventDraft("running", actor, runtime, call_id) if starts else None
    return Change(values, submitted, started).of(job)


def attempt_failure(
    job: JobRecord,
    *,
    now: datetime,
    runtime: str,
    error_code: str,
    message: str,
    retryable: bool,
    actor: str,
) -> Change:
    values = {"attempts": _count_attempt(job.attempts, runtime), "updated_at": now}
    detail = {"retryable": retryable, "message": message}
    call_id = _call_id_of(job, runtime)
    return Change(values, EventDraft("failed", actor, runtime, call_id, error_code, detail))


def release(
    job: JobRecord,
    *,
    now: datetime,
    not_before: datetime | None,
    status: str,
    error_code: str | None,
    actor: str,
    why: Mapping[str, str] | None = None,
) -> Change:
    """Back to the queue; ``why``: each runtime's reason for not taking the job (a deferral's
    detail, each reason cut to 200 characters as a ``walked`` event's)."""
    if status not in RELEASE_STATUSES:
        raise ValueError(f"release status must be released or deferred, got {status!r}")
    values = {"state": "queued", "not_before": not_before, "updated_at": now} | _NO_LEASE
    detail: dict[str, Any] = {} if not_before is None else {"not_before": not_before.isoformat()}
    if why:
        detail["why"] = {check_runtime(runtime): reason[:200] for runtime, reason in why.items()}
    return Change(values, _lease_event(job, status, actor, error_code, detail)).of(job)


def extend(*, now: datetime, lease_s: float) -> Change:
    expires_at = now + timedelta(seconds=check_lease_s(lease_s))
    return Change({"lease_expires_at": expires_at, "updated_at": now})


def mark_running(job: JobRecord, *, now: datetime, actor: str) -> Change:
    if job.state == "running":
        return UNCHANGED
    event = _lease_event(job, "running", actor)
    return Change({"state": "running", "updated_at": now}, event).of(job)


def progress(job: JobRecord, *, now: datetime, detail: dict[str, Any], actor: str | None) -> Change:
    call = job.call
    chosen = actor or (f"worker:{call[0]}" if call else CLAIM_ACTOR)
    return Change({"updated_at": now}, _lease_event(job, "progress", chosen, detail=detail))


def complete(
    job: JobRecord,
    *,
    now: datetime,
    result: Any,
    result_ref: str | None,
    cost_cents: float | None,
    actor: str,
) -> Change:
    values = _finished(now, "completed") | {
        "result": result,
        "result_ref": result_ref,
        "cost_cents": cost_cents,
    }
    detail = {} if cost_cents is None else {"cost_cents": cost_cents}
    return Change(values, _lease_event(job, "completed", actor, detail=detail)).of(job)


def fail(job: JobRecord, *, now: datetime, error_code: str, message: str, actor: str) -> Change:
    values = _finished(now, "failed") | {"error_code": error_code, "error_message": message}
    detail = {"message": message, "terminal": True}
    return Change(values, _lease_event(job, "failed", actor, error_code, detail)).of(job)


def cancel(job: JobRecord, *, now: datetime, actor: str) -> Change:
    if job.terminal:
        return UNCHANGED
    detail = {"from": job.state}
    event = _lease_event(job, "cancelled", actor, None, detail)
    return Change(_finished(now, "cancelled"), event).of(job)


def retry(job: JobRecord, *, now: datetime, actor: str) -> Change:
    if job.state != "failed":
        return UNCHANGED
    values = {
        "state": "queued",
        "attempts": {},
        "submit_count": 0,
        "rescue_count": 0,
        "error_code": None,
        "error_message": None,
        "not_before": None,
        "finished_at": None,
        "updated_at": now,
    } | _NO_LEASE
    detail = {"previous_error": job.error_code}
    return Change(values, EventDraft("retried", actor, runtime=job.runner, detail=detail)).of(job)


def rescue(job: JobRecord, *, now: datetime, max_rescues: int, actor: str) -> Change:
    """Back to the queue, or ``LEASE_LOST`` once the job was rescued ``max_rescues`` times."""
    rescues = job.rescue_count + 1
    if rescues > max_rescues:
        message = f"lease lost {rescues} times (max_rescues={max_rescues})"
        values = _finished(now, "failed") | {"error_code": LEASE_LOST, "error_message": message}
        detail = {"message": message, "terminal": True, "from": job.state}
        return Change(values, _lease_event(job, "failed", actor, LEASE_LOST, detail)).of(job)
    values = {"state": "queued", "rescue_count": rescues, "not_before": None, "updated_at": now}
    detail = {"rescue_count": rescues, "from": job.state}
    return Change(values | _NO_LEASE, _lease_event(job, "rescued", actor, None, detail)).of(job)


def _finished(now: datetime, state: str) -> dict[str, Any]:
    return {"state": state, "finished_at": now, "updated_at": now} | _NO_LEASE


def _count_attempt(attempts: dict[str, int], runtime: str) -> dict[str, int]:
    return attempts | {runtime: attempts.get(runtime, 0) + 1}


def _call_id_of(job: JobRecord, runtime: str) -> str | None:
    call = job.call
    return call[1] if call is not None and call[0] == runtime else None


def _lease_event(
    job: JobRecord,
    status: str,
    actor: str,
    error_code: str | None = None,
    detail: dict[str, Any] | None = None,
) -> EventDraft:
    """An event about the lease the job holds now: it names the call when a runtime holds it."""
    call = job.call
    runtime, call_id = call if call is not None else (job.runner, None)
    return EventDraft(status, actor, runtime, call_id, error_code, detail or {})
