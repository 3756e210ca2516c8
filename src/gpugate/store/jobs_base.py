"""The job half of the store's interface: its protocol (the values it hands back and takes are
the job domain's, :mod:`gpugate.core.job_states`, re-exported here).

:class:`gpugate.store.base.Store` extends :class:`JobStore`; both backends implement it and
pass the contract suite ``tests/store/test_store_jobs*.py``.

Errors: arguments only a caller's bug can get wrong (an unknown class, state, actor or runtime
id, a non-positive lease, a naive datetime) raise ValueError; what only the store can judge
about a client's input (a taken slug, a malformed cursor) raises
:class:`gpugate.errors.BadRequest`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from gpugate.core.job_states import (
    DEFAULT_OPERATION,
    JOB_ACTORS,
    JOB_CLASSES,
    JOB_EVENT_STATUSES,
    JOB_STATES,
    LEASE_LOST,
    LEASED_STATES,
    TERMINAL_STATES,
    JobEvent,
    JobRecord,
    JobState,
    NewJob,
    check_actor,
    check_aware,
    check_runtime,
    check_slug,
)
from gpugate.errors import BadRequest

if TYPE_CHECKING:
    from collections.abc import Callable
    from datetime import datetime

__all__ = [
    "DEFAULT_OPERATION",
    "JOB_ACTORS",
    "JOB_CLASSES",
    "JOB_EVENT_STATUSES",
    "JOB_STATES",
    "LEASED_STATES",
    "LEASE_LOST",
    "TERMINAL_STATES",
    "JobEvent",
    "JobPage",
    "JobRecord",
    "JobState",
    "JobStore",
    "NewJob",
    "check_actor",
    "check_aware",
    "check_runtime",
    "check_slug",
    "job_cursor",
    "parse_job_cursor",
]

_MAX_ID = 2**63 - 1


def job_cursor(job_id: int) -> str:
    """The cursor of :meth:`JobStore.list_jobs` that continues after (older than) ``job_id``."""
    return str(job_id)


def parse_job_cursor(cursor: str) -> int:
    """The job id a cursor of :func:`job_cursor` holds; BadRequest for anything else."""
    if not (cursor.isascii() and cursor.isdigit() and int(cursor[:20]) <= _MAX_ID):
        raise BadRequest(f"invalid jobs cursor {cursor[:40]!r}")
    return int(cursor)


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
