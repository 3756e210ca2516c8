"""The job domain (issue #17): what a job is, its states and the moves between them.

* :class:`JobState` and :data:`TRANSITIONS` — ``queued -> dispatching -> running -> completed |
  failed | cancelled``; a lease ended early puts a job back in the queue, an operator's retry
  takes a failed one back there (:func:`check_transition` refuses any other move);
* the values the store hands back (:class:`JobRecord`, :class:`JobEvent`) and takes
  (:class:`NewJob`), with the checks of their fields; the lease of a job is typed
  (:mod:`gpugate.core.lease`).

The rules that decide each change live in :mod:`gpugate.core.job_transitions`; the store only
writes what they decide.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from gpugate.core.lease import RESERVED_CALL, Lease, LeaseKind, stored_lease

if TYPE_CHECKING:
    from datetime import datetime


class JobState(StrEnum):
    QUEUED = "queued"
    DISPATCHING = "dispatching"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    JobState.QUEUED: frozenset({JobState.DISPATCHING, JobState.CANCELLED}),
    JobState.DISPATCHING: frozenset(
        {JobState.QUEUED, JobState.RUNNING, JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED}
    ),
    JobState.RUNNING: frozenset(
        {JobState.QUEUED, JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED}
    ),
    JobState.COMPLETED: frozenset(),
    JobState.FAILED: frozenset({JobState.QUEUED}),
    JobState.CANCELLED: frozenset(),
}
"""Every state and the states a job may move to from it (staying is no move)."""


_MOVES = frozenset((old.value, new.value) for old, news in TRANSITIONS.items() for new in news)


def check_transition(current: str, new: str) -> str:
    """``new`` when a job in ``current`` may move there, else ValueError."""
    if new != current and (current, new) not in _MOVES:
        raise ValueError(f"a {current} job cannot become {new}")
    return new


JOB_CLASSES = ("system", "interactive", "batch")
"""A job's request class, most urgent first."""

JOB_STATES = tuple(state.value for state in JobState)
"""``queued -> dispatching -> running -> completed | failed | cancelled``."""

LEASED_STATES = frozenset({JobState.DISPATCHING.value, JobState.RUNNING.value})
"""The states in which a job holds a lease: ``leased_by``, ``lease_token``, ``lease_expires_at``."""

TERMINAL_STATES = frozenset(
    {JobState.COMPLETED.value, JobState.FAILED.value, JobState.CANCELLED.value}
)
"""The states a job leaves only by an explicit :meth:`JobStore.retry_job` (``failed`` only)."""

JOB_EVENT_STATUSES = (
    "queued",
    "dispatching",
    "submitted",
    "running",
    "progress",
    "completed",
    "failed",
    "cancelled",
    "deferred",
    "released",
    "rescued",
    "retried",
    "walked",
)
"""The vocabulary of :attr:`JobEvent.status`."""

JOB_ACTORS = ("api", "dispatcher", "reaper", "admin", "worker:<runtime>")
"""Who may write a job event (:attr:`JobEvent.actor`)."""

DEFAULT_OPERATION = "chat/completions"
"""The operation of a job that names none: ``POST /v1/chat/completions`` on an upstream."""

LEASE_LOST = "LEASE_LOST"
"""The error code of a job failed by :meth:`JobStore.rescue` after ``max_rescues`` rescues."""

_SLUG = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def check_slug(slug: str) -> str:
    """A slug is 1-128 letters, digits, ``.``, ``_``, ``-`` (no ``:``), starting alphanumeric."""
    if not _SLUG.fullmatch(slug):
        raise ValueError(
            f"invalid job slug {slug!r}: expected 1-128 letters, digits, '.', '_' or '-',"
            " starting with a letter or digit"
        )
    return slug


def check_runtime(runtime: str) -> str:
    """A runtime id is non-empty and holds no ``:`` (``leased_by`` is ``<runtime>:<call_id>``)."""
    if not runtime or ":" in runtime:
        raise ValueError(f"invalid runtime id {runtime!r}: expected a non-empty id without ':'")
    return runtime


def check_actor(actor: str) -> str:
    """``api``, ``dispatcher``, ``reaper``, ``admin`` or ``worker:<runtime>``."""
    kind, colon, runtime = actor.partition(":")
    if (colon and kind == "worker" and runtime and ":" not in runtime) or (
        not colon and actor in JOB_ACTORS
    ):
        return actor
    raise ValueError(f"invalid job event actor {actor!r}: expected one of {', '.join(JOB_ACTORS)}")


def check_aware(moment: datetime | None, name: str) -> datetime | None:
    """Times given to the store must be timezone-aware (they are stored as UTC)."""
    if moment is not None and moment.utcoffset() is None:
        raise ValueError(f"{name} must be timezone-aware, got {moment!r}")
    return moment


@dataclass(frozen=True, slots=True, kw_only=True)
class NewJob:
    """A job to store: what to run, where to start, and the client's idempotency key.

    ``runner`` is the runtime the job is assigned to first (the requested one, or the config's
    ``default_runtime``: the store does not read the config). ``slug`` is generated
    (``job_`` + 20 url-safe characters) when not given. ``input_ref`` names a blob holding an
    input too large to keep inline. ``not_before`` keeps the job from being claimed earlier.
    ``allow_external`` is True unless the job may not leave the building (DESIGN §5.7); the
    API decides what a request that says nothing gets.
    """

    model: str
    input: dict[str, Any]
    runner: str
    job_class: str = "batch"
    operation: str = DEFAULT_OPERATION
    slug: str | None = None
    idempotency_key: str | None = None
    allow_external: bool = True
    input_ref: str | None = None
    not_before: datetime | None = None

    def __post_init__(self) -> None:
        if not self.model:
            raise ValueError("a job needs a model")
        if self.job_class not in JOB_CLASSES:
            raise ValueError(
                f"invalid job class {self.job_class!r}: expected one of {', '.join(JOB_CLASSES)}"
            )
        if not self.operation:
            raise ValueError("a job needs an operation")
        check_runtime(self.runner)
        if self.slug is not None:
            check_slug(self.slug)
        if self.idempotency_key == "":
            raise ValueError("an idempotency key may not be empty (pass None for none)")
        check_aware(self.not_before, "not_before")


@dataclass(frozen=True, slots=True)
class JobRecord:
    """A stored job: every column of its row, times timezone-aware UTC.

    ``attempts`` counts submissions and failed attempts per runtime id (reset by a retry).
    Who holds a leased job is :attr:`lease` (its four ``lease_*`` columns); ``leased_by`` is the
    same as text for people (``<slug>-dispatcher@<replica>`` while a dispatcher holds it,
    ``<runtime>:<call_id>`` once a runtime accepted it), never parsed. ``lease_token`` fences
    every write of the lease holder and changes with every claim. ``input``, ``result`` and the
    token are left out of ``repr``.
    """

    id: int
    slug: str
    idempotency_key: str | None
    model: str
    job_class: str
    operation: str
    input: dict[str, Any] = field(repr=False)
    input_ref: str | None
    runner: str
    state: str
    attempts: dict[str, int]
    submit_count: int
    rescue_count: int
    leased_by: str | None
    lease_token: str | None = field(repr=False)
    lease_expires_at: datetime | None
    not_before: datetime | None
    allow_external: bool
    result: Any = field(repr=False)
    result_ref: str | None
    error_code: str | None
    error_message: str | None
    cost_cents: float | None
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None
    lease_kind: str | None = None
    lease_runtime: str | None = None
    lease_call_id: str | None = None
    lease_replica: str | None = None

    @property
    def terminal(self) -> bool:
        """Completed, failed or cancelled."""
        return self.state in TERMINAL_STATES

    @property
    def lease(self) -> Lease | None:
        """Who holds the job, None when nobody does."""
        return stored_lease(
            self.lease_kind, self.lease_runtime, self.lease_call_id, self.lease_replica
        )

    @property
    def call(self) -> tuple[str, str] | None:
        """``(runtime, call_id)`` when a runtime's call (or a reserved slot of one, call id
        :data:`~gpugate.core.lease.RESERVED_CALL`) holds the job, else None."""
        runtime = self.lease_runtime  # the columns, not a Lease: this is on every write's path
        if runtime is None or self.lease_kind == LeaseKind.CLAIM:
            return None
        return runtime, self.lease_call_id or RESERVED_CALL


@dataclass(frozen=True, slots=True)
class JobEvent:
    """One entry of a job's audit trail, appended with the state change it records.

    ``runtime`` is the runtime the event concerns (the one named by the operation, else the one
    whose call held the lease, else the job's runner); ``call_id`` is set when a call held it.
    """

    id: int
    slug: str
    at: datetime
    status: str
    actor: str
    runtime: str | None
    call_id: str | None
    error_code: str | None
    detail: dict[str, Any]
