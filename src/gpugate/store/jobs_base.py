"""The job half of the store's interface: the values a job store hands back and its protocol.

:class:`gpugate.store.base.Store` extends :class:`JobStore`; both backends implement it and
pass the contract suite ``tests/store/test_store_jobs*.py``.

Errors: arguments only a caller's bug can get wrong (an unknown class, state, actor or runtime
id, a non-positive lease, a naive datetime) raise ValueError; what only the store can judge
about a client's input (a taken slug, a malformed cursor) raises
:class:`gpugate.errors.BadRequest`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from gpugate.errors import BadRequest

if TYPE_CHECKING:
    from collections.abc import Callable
    from datetime import datetime

JOB_CLASSES = ("system", "interactive", "batch")
"""A job's request class, most urgent first."""

JOB_STATES = ("queued", "dispatching", "running", "completed", "failed", "cancelled")
"""``queued -> dispatching -> running -> completed | failed | cancelled``."""

LEASED_STATES = frozenset({"dispatching", "running"})
"""The states in which a job holds a lease: ``leased_by``, ``lease_token``, ``lease_expires_at``."""

TERMINAL_STATES = frozenset({"completed", "failed", "cancelled"})
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
_MAX_ID = 2**63 - 1


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


TENANT_JOBS = " AND slug IN (SELECT id FROM tenancy WHERE kind = 'job' AND tenant = {})"
"""The filter :meth:`JobStore.list_jobs` adds for a ``tenant`` (the backend's placeholder in)."""


def job_cursor(job_id: int) -> str:
    """The cursor of :meth:`JobStore.list_jobs` that continues after (older than) ``job_id``."""
    return str(job_id)


def parse_job_cursor(cursor: str) -> int:
    """The job id a cursor of :func:`job_cursor` holds; BadRequest for anything else."""
    if not (cursor.isascii() and cursor.isdigit() and int(cursor[:20]) <= _MAX_ID):
        raise BadRequest(f"invalid jobs cursor {cursor[:40]!r}")
    return int(cursor)


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
    ``leased_by`` is ``<slug>-dispatcher@<replica>`` while a dispatcher holds the job, and
    ``<runtime>:<call_id>`` once a runtime accepted it; ``lease_token`` fences every write of the
    lease holder and changes with every claim. ``input``, ``result`` and the token are left out
    of ``repr``.
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

    @property
    def terminal(self) -> bool:
        """Completed, failed or cancelled."""
        return self.state in TERMINAL_STATES

    @property
    def call(self) -> tuple[str, str] | None:
        """``(runtime, call_id)`` when the lease is a runtime's call, else None."""
        if self.leased_by is None or ":" not in self.leased_by:
            return None
        runtime, _, call_id = self.leased_by.partition(":")
        return runtime, call_id


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


@dataclass(frozen=True, slots=True)
class JobPage:
    """One page of :meth:`JobStore.list_jobs`, newest first; ``next_cursor`` None on the last."""

    jobs: list[JobRecord]
    next_cursor: str | None


class JobStore(Protocol):
    """The durable jobs: creation, claims, fenced lease-holder writes, operator verbs, reaping.

    Every method is atomic (creates and fenced writes in flight at the same moment may share one
    transaction — group commit — but each succeeds, is refused or fails on its own) and takes
    its time from the store's clock. Lifecycle: :meth:`create_job` (``queued``) ->
    :meth:`claim_jobs` or :meth:`claim_job` (``dispatching``, a fresh lease and token) ->
    :meth:`promote_runner`, :meth:`record_submit`, :meth:`record_attempt_failure` ->
    :meth:`mark_running` (or ``record_submit(running=True)``) -> :meth:`complete` |
    :meth:`fail`; :meth:`release` puts a job back in the queue, :meth:`rescue` takes back a
    lost lease.

    **Fencing.** Every method that takes ``token`` changes nothing and answers False / None
    unless the job is ``dispatching`` or ``running`` and its current ``lease_token`` equals
    ``token``. A token stays the same for the whole lease (the dispatcher's claim, the submit,
    the runtime's call) and dies when the job is released, rescued, finished or cancelled, so a
    late writer holding an old token changes nothing. An expired lease that nobody took back
    yet is still honoured: only :meth:`rescue` ends it.
    """

    async def create_job(self, new: NewJob) -> tuple[JobRecord, bool]:
        """Store ``new`` as ``queued`` (event ``queued``); returns (job, created).

        With an ``idempotency_key`` already used, by any job in any state, returns that job and
        False and stores nothing, however many callers race (the unique key decides). A taken
        ``slug`` under another (or no) key raises BadRequest.
        """
        ...

    async def get_job(self, slug: str) -> JobRecord | None:
        """The job, None when no job has this slug."""
        ...

    async def job_by_idempotency_key(self, key: str) -> JobRecord | None:
        """The job created with ``key``, None when there is none."""
        ...

    async def job_events(self, slug: str) -> list[JobEvent]:
        """The job's events, oldest first; empty for an unknown slug."""
        ...

    async def list_jobs(
        self,
        *,
        state: str | None = None,
        runner: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
        tenant: str | None = None,
    ) -> JobPage:
        """Jobs newest first (by id), optionally of one state and/or runner (and of one
        ``tenant``: the jobs it owns, :meth:`KeyStore.own`).

        ``cursor`` is the ``next_cursor`` of the previous page (opaque); a malformed one raises
        BadRequest, an unknown ``state`` or a ``limit`` below 1 ValueError.
        """
        ...

    async def claim_jobs(
        self,
        *,
        limit: int,
        lease_s: float,
        now: datetime | None = None,
        due_by: datetime | None = None,
    ) -> list[JobRecord]:
        """Lease up to ``limit`` claimable jobs to the dispatcher, oldest (lowest id) first.

        Claimable: ``queued``, ``not_before`` null or reached by ``due_by``, no live lease. Each
        claimed job becomes ``dispatching`` with ``leased_by = "<slug>-dispatcher@<replica>"``,
        a fresh ``lease_token`` and ``lease_expires_at = now + lease_s`` (event
        ``dispatching`` at ``now``). Concurrent claimers (other replicas included) never get the
        same job; a claimer may get fewer than ``limit`` while others hold rows. ``now``
        defaults to the store's clock, ``due_by`` to ``now``: a claimer that looks ahead (a
        slot freed, so jobs waiting for one are due early) still stamps the claim with the time
        it happened.
        """
        ...

    async def claim_job(self, slug: str, *, lease_s: float) -> JobRecord | None:
        """:meth:`claim_jobs` for one job (the event-driven path); None unless claimable now."""
        ...

    async def promote_runner(
        self, slug: str, token: str, runtime: str, *, actor: str = "dispatcher", why: str = ""
    ) -> bool:
        """Make ``runtime`` the job's runner (event ``walked`` when it changes, its detail
        saying from which runtime and ``why`` it was left). Fenced."""
        ...

    async def record_submit(
        self,
        slug: str,
        token: str,
        *,
        runtime: str,
        call_id: str,
        lease_s: float,
        running: bool,
        actor: str = "dispatcher",
    ) -> bool:
        """Record that ``runtime`` accepted the job as ``call_id``. Fenced; keeps the token.

        ``leased_by = "<runtime>:<call_id>"``, ``submit_count + 1``, ``attempts[runtime] + 1``,
        ``lease_expires_at = now + lease_s``, event ``submitted``. ``running`` (a serverless
        call runs from submit) makes the job ``running``; otherwise its state stays as it is (a
        fast push worker may have marked it running already). False when the job finished or
        lost its lease meanwhile: nothing more to do for this lease.
        """
        ...

    async def record_attempt_failure(
        self,
        slug: str,
        token: str,
        *,
        runtime: str,
        error_code: str,
        message: str,
        retryable: bool,
        actor: str = "dispatcher",
    ) -> bool:
        """Count a failed attempt on ``runtime`` (``attempts[runtime] + 1``; event ``failed``
        with ``error_code`` and detail ``{retryable, message}``). The job stays leased. Fenced.
        """
        ...

    async def release(
        self,
        slug: str,
        token: str,
        *,
        not_before: datetime | None = None,
        status: str = "released",
        error_code: str | None = None,
        actor: str = "dispatcher",
    ) -> bool:
        """Put the job back in the queue: ``queued``, lease cleared, ``not_before`` set as given.

        ``status`` is ``released`` or ``deferred`` (with ``not_before`` and an ``error_code``
        such as ``GPU_SATURATED`` or ``AT_CAPACITY``). Fenced.
        """
        ...

    async def extend_lease(self, slug: str, token: str, *, lease_s: float) -> datetime | None:
        """Set ``lease_expires_at = now + lease_s`` and return it; None when fenced off.

        Not a state change: no event.
        """
        ...

    async def mark_running(self, slug: str, token: str, *, actor: str) -> bool:
        """A push worker's ``claimed``: ``dispatching -> running`` (event ``running``). Fenced.

        True, changing nothing, when the job is running already (a repeated ``claimed``).
        """
        ...

    async def record_progress(
        self, slug: str, token: str, detail: dict[str, Any], *, actor: str | None = None
    ) -> bool:
        """Append a ``progress`` event with ``detail``. Fenced.

        ``actor`` defaults to ``worker:<runtime>`` of the call holding the lease (``dispatcher``
        before a submit).
        """
        ...

    async def complete(
        self,
        slug: str,
        token: str,
        *,
        result: Any,
        cost_cents: float | None = None,
        actor: str,
        result_ref: str | None = None,
    ) -> bool:
        """``completed`` with ``result`` (JSON) or ``result_ref`` (a blob), lease cleared,
        ``finished_at`` set (event ``completed``). Fenced.
        """
        ...

    async def fail(
        self, slug: str, token: str, *, error_code: str, message: str, actor: str
    ) -> bool:
        """Terminal ``failed`` (``CHAIN_EXHAUSTED``, ``LEASE_LOST``, ...), lease cleared,
        ``finished_at`` set (event ``failed``, detail ``{message, terminal: true}``). Fenced.
        """
        ...

    async def cancel_job(self, slug: str, *, actor: str) -> JobRecord | None:
        """``queued | dispatching | running -> cancelled``, lease cleared, ``finished_at`` set
        (event ``cancelled``, naming the call that held the lease). A finished job is returned
        as it is; None for an unknown slug. Not fenced (operator/API verb).
        """
        ...

    async def retry_job(self, slug: str, *, actor: str) -> JobRecord | None:
        """``failed -> queued`` (event ``retried``): a fresh drive, so attempts, submit and
        rescue counts start again and the error, ``not_before`` and ``finished_at`` are
        cleared. Any other job is returned as it is; None for an unknown slug. Not fenced.
        """
        ...

    async def expired_leases(
        self, *, now: datetime | None = None, limit: int = 100
    ) -> list[JobRecord]:
        """``dispatching``/``running`` jobs whose lease expired (``lease_expires_at <= now``),
        the longest expired first, tokens included so that :meth:`rescue` can be fenced.
        """
        ...

    async def rescue(
        self, slug: str, token: str, *, max_rescues: int, actor: str = "reaper"
    ) -> JobRecord | None:
        """Take back a lost lease. Fenced (None when the token is stale).

        ``rescue_count + 1`` and back to ``queued`` (event ``rescued``); but when that count
        would exceed ``max_rescues``, terminal ``failed`` with ``LEASE_LOST`` instead. Does not
        look at the expiry: the reaper also rescues calls their runtime reports lost.
        """
        ...

    async def count_leased(self, runtime: str) -> int:
        """Calls of ``runtime`` in flight: ``dispatching``/``running`` jobs whose ``leased_by``
        is ``<runtime>:...`` (all replicas; what ``max_concurrency`` limits).
        """
        ...

    async def queue_depth(self, runtime: str) -> int:
        """``queued`` jobs whose runner is ``runtime``."""
        ...

    async def watch_jobs(self, on_job: Callable[[str], None]) -> None:
        """Call ``on_job(slug)`` whenever a process creates a job, until
        cancelled (PostgreSQL: LISTEN/NOTIFY, so every replica wakes at once). Returns at once
        where one process owns the store (SQLite): the dispatcher is woken in-process."""
        ...
