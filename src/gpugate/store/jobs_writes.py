"""The job store's writes: creation, the lease holder's fenced writes, the operator verbs and
the rescue, once for every backend.

Each method validates its arguments, takes the time from the clock and hands one decision
(a function of :mod:`gpugate.core.job_transitions`) to a primitive the backend implements:

* :meth:`JobWrites._change_leased_many` applies a batch of fenced decisions in one transaction:
  for each, it reads the job (locked) and writes the decision's change and event only when the
  job is ``dispatching``/``running`` and holds the write's token (the fence), in order, so two
  writes of one job in one batch see each other;
* :meth:`JobWrites._create_many` stores a batch of new jobs in one transaction;
* :meth:`JobWrites._change_job` changes one job whatever its lease (operator verbs).

Creates and fenced writes go through :class:`~gpugate.store.group_commit.GroupCommit`: written
at once when the store is idle, and together with whatever arrived meanwhile when it is busy
(fenced writes: ``_leased_overlap`` batches at once, so on PostgreSQL a completion does not wait
for an unrelated batch to commit; SQLite has one writer, and one batch at a time).
Each write still succeeds or fails on its own: a backend answers an exception for an item that
failed, not for the batch.
"""

from __future__ import annotations

import logging
from abc import abstractmethod
from dataclasses import dataclass, fields
from datetime import UTC
from functools import partial
from operator import attrgetter
from typing import TYPE_CHECKING, Any, Protocol

from gpugate.core import job_transitions as transitions
from gpugate.core.job_states import (
    LEASED_STATES,
    JobRecord,
    NewJob,
    check_actor,
    check_aware,
    check_runtime,
)
from gpugate.store.group_commit import GroupCommit

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence
    from datetime import datetime

    from gpugate.clock import Clock

    Decide = Callable[[JobRecord], transitions.Change]
    Rule = Callable[..., transitions.Change]


log = logging.getLogger("gpugate.jobs")
#: Events that say something happened to a job rather than that it is still alive.
_QUIET_EVENTS = frozenset({"progress"})


class _Noted:
    """A ``decide`` that remembers the event it made, so the transition is logged once the
    write has committed (one INFO line per job transition, issue #19)."""

    __slots__ = ("decide", "events")

    def __init__(self, decide: Decide) -> None:
        self.decide = decide
        self.events: tuple[transitions.EventDraft, ...] = ()

    def __call__(self, job: JobRecord) -> transitions.Change:
        change = self.decide(job)
        self.events = change.events
        return change

    def log(self, slug: str) -> None:
        for event in self.events:
            _log_event(slug, event)


def _log_event(slug: str, event: transitions.EventDraft) -> None:
    """One INFO line for one transition of a job (DEBUG for a progress report)."""
    level = logging.DEBUG if event.status in _QUIET_EVENTS else logging.INFO
    if not log.isEnabledFor(level):
        return
    where = f" on {event.runtime}" if event.runtime else ""
    why = f" {event.error_code}" if event.error_code else ""
    log.log(
        level,
        "job %s %s%s%s by %s",
        slug, event.status, where, why, event.actor,
        extra={"job": slug, "event": event.status, "runtime": event.runtime,
               "error_code": event.error_code, "actor": event.actor},
    )  # fmt: skip


@dataclass(frozen=True, slots=True)
class LeasedWrite:
    """One fenced write of a batch: ``decide`` applies to ``slug`` if it holds ``token``."""

    slug: str
    token: str
    now: datetime
    decide: Decide


@dataclass(frozen=True, slots=True)
class Creation:
    """One job of a batch of creates, its slug chosen and its time taken."""

    new: NewJob
    slug: str
    now: datetime


Created = tuple[JobRecord, bool]


def fenced(job: JobRecord, token: str) -> bool:
    """The fence: the job is leased (``dispatching``/``running``) and holds ``token``."""
    return job.state in LEASED_STATES and job.lease_token == token


_JOB_FIELDS = tuple(f.name for f in fields(JobRecord))
_FIELD_AT = {name: at for at, name in enumerate(_JOB_FIELDS)}
_ALL_VALUES = attrgetter(*_JOB_FIELDS)


def written(job: JobRecord, change: transitions.Change) -> JobRecord:
    """The job as ``change`` leaves it: what the backend wrote, as reading it back would give.

    ``dataclasses.replace`` by position (three per job, on SQLite's store thread, under the
    GIL): its walk of the 29 fields and its keyword call were twice the cost of reading them
    all with one ``attrgetter`` and calling the class with the changed ones put in place."""
    if not change.values:
        return job
    values = list(_ALL_VALUES(job))
    for name, value in change.values.items():
        values[_FIELD_AT[name]] = _as_read(name, value)
    return JobRecord(*values)


def _as_read(name: str, value: Any) -> Any:
    if value is None:
        return None
    if name in transitions.TIME_FIELDS:
        return value.astimezone(UTC)
    if name == "cost_cents":
        return float(value)
    return value


class JobWrites(Protocol):
    """The writes of :class:`gpugate.store.jobs_sql.JobStore`, batched by group commit."""

    _clock: Clock
    _replica: str
    _leased_group: GroupCommit[LeasedWrite, JobRecord | None] | None = None
    _create_group: GroupCommit[Creation, Created] | None = None
    _leased_overlap: int = 1

    @abstractmethod
    async def _change_leased_many(
        self, writes: Sequence[LeasedWrite]
    ) -> Sequence[JobRecord | Exception | None]:
        """In one transaction, in order: for each write, lock the job, and when it is leased
        with the write's token (:func:`fenced`, against the job as the earlier writes of the
        batch left it) apply ``decide``'s change and event (at ``now``). Per write: the job as
        written, None when the fence refuses, or the exception that write alone raised.
        """

    @abstractmethod
    async def _create_many(self, creations: Sequence[Creation]) -> Sequence[Created | Exception]:
        """In one transaction, store each new job as ``queued`` with its ``queued`` event (see
        :meth:`create_job`); per creation ``(job, created)``, or the exception (BadRequest for
        a slug taken under another key) of that creation alone.
        """

    async def create_job(self, new: NewJob) -> tuple[JobRecord, bool]:
        """Store ``new`` as ``queued`` (event ``queued``); returns (job, created).

        With an ``idempotency_key`` already used, by any job in any state, returns that job and
        False and stores nothing, however many callers race (the unique key decides). A taken
        ``slug`` under another (or no) key raises BadRequest.
        """
        creation = Creation(new, new.slug or transitions.new_slug(), self._clock.now())
        if self._create_group is None:
            self._create_group = GroupCommit(self._create_many)
        return await self._create_group.submit(creation)

    async def _change_leased(
        self, slug: str, token: str, now: datetime, decide: Decide
    ) -> JobRecord | None:
        """One fenced write, group-committed with the others in flight."""
        if self._leased_group is None:
            overlap = self._leased_overlap
            self._leased_group = GroupCommit(self._change_leased_many, overlap=overlap)
        noted = _Noted(decide)
        job = await self._leased_group.submit(LeasedWrite(slug, token, now, noted))
        if job is not None:
            noted.log(slug)
        return job

    @abstractmethod
    async def _change_job(self, slug: str, now: datetime, decide: Decide) -> JobRecord | None:
        """:meth:`_change_leased` without the fence; None for an unknown slug."""

    async def _noted_change(self, slug: str, now: datetime, decide: Decide) -> JobRecord | None:
        """:meth:`_change_job`, its transition logged once committed."""
        noted = _Noted(decide)
        job = await self._change_job(slug, now, noted)
        if job is not None:
            noted.log(slug)
        return job

    async def _fenced(self, slug: str, token: str, rule: Rule, **given: Any) -> JobRecord | None:
        """``rule`` (a function of :mod:`gpugate.core.job_transitions`) applied now, fenced."""
        now = self._clock.now()
        return await self._change_leased(slug, token, now, partial(rule, now=now, **given))

    async def promote_runner(
        self, slug: str, token: str, runtime: str, *, actor: str = "dispatcher", why: str = ""
    ) -> bool:
        """Make ``runtime`` the job's runner (event ``walked`` when it changes, its detail
        saying from which runtime and ``why`` it was left). Fenced."""
        check_runtime(runtime)
        check_actor(actor)
        done = await self._fenced(
            slug, token, transitions.promote, runtime=runtime, actor=actor, why=why
        )
        return done is not None

    async def record_submit(  # noqa: PLR0913 - the fence, then what the acceptance records
        self,
        slug: str,
        token: str,
        *,
        runtime: str,
        call_id: str,
        lease_s: float,
        running: bool,
        actor: str = "dispatcher",
        in_process: bool = False,
    ) -> bool:
        """Record that ``runtime`` accepted the job as ``call_id``. Fenced; keeps the token.

        ``leased_by = "<runtime>:<call_id>"``, ``submit_count + 1``, ``attempts[runtime] + 1``,
        ``lease_expires_at = now + lease_s``, event ``submitted``. ``running`` (an upstream or
        serverless call runs from submit) makes the job ``running``, with its event ``running``
        after ``submitted`` in the same write; otherwise its state stays as it is (a fast push
        worker may have marked it running already). ``in_process``: the call runs in this
        replica (an ``upstream`` runtime's), so the lease names the replica and dies with it
        (:meth:`ReplicaStore.reclaim_silent`). False when the job finished or lost its lease
        meanwhile: nothing more to do for this lease.
        """
        check_runtime(runtime)
        transitions.check_lease_s(lease_s)
        check_actor(actor)
        if not call_id:
            raise ValueError("a submit needs the runtime's call id")
        given = {"runtime": runtime, "call_id": call_id, "lease_s": lease_s, "running": running}
        given["replica"] = self._replica if in_process else None
        return await self._fenced(slug, token, transitions.submit, actor=actor, **given) is not None

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
        check_runtime(runtime)
        check_actor(actor)
        given = {"error_code": error_code, "message": message, "retryable": retryable}
        rule = transitions.attempt_failure
        return (
            await self._fenced(slug, token, rule, runtime=runtime, actor=actor, **given) is not None
        )

    async def release(
        self,
        slug: str,
        token: str,
        *,
        not_before: datetime | None = None,
        status: str = "released",
        error_code: str | None = None,
        actor: str = "dispatcher",
        why: Mapping[str, str] | None = None,
    ) -> bool:
        """Put the job back in the queue: ``queued``, lease cleared, ``not_before`` set as given.

        ``status`` is ``released`` or ``deferred`` (with ``not_before`` and an ``error_code``
        such as ``GPU_SATURATED`` or ``AT_CAPACITY``); ``why``, for a deferral: what kept each
        runtime from taking the job (the event's detail). Fenced.
        """
        if status not in transitions.RELEASE_STATUSES:
            raise ValueError(f"release status must be released or deferred, got {status!r}")
        check_actor(actor)
        check_aware(not_before, "not_before")
        given = {"not_before": not_before, "status": status, "error_code": error_code, "why": why}
        return (
            await self._fenced(slug, token, transitions.release, actor=actor, **given) is not None
        )

    async def extend_lease(self, slug: str, token: str, *, lease_s: float) -> datetime | None:
        """Set ``lease_expires_at = now + lease_s`` and return it; None when fenced off.

        Not a state change: no event.
        """
        transitions.check_lease_s(lease_s)
        job = await self._fenced(slug, token, _extend, lease_s=lease_s)
        return None if job is None else job.lease_expires_at

    async def mark_running(self, slug: str, token: str, *, actor: str) -> bool:
        """A push worker's ``claimed``: ``dispatching -> running`` (event ``running``). Fenced.

        True, changing nothing, when the job is running already (a repeated ``claimed``).
        """
        check_actor(actor)
        return await self._fenced(slug, token, transitions.mark_running, actor=actor) is not None

    async def record_progress(
        self, slug: str, token: str, detail: dict[str, Any], *, actor: str | None = None
    ) -> bool:
        """Append a ``progress`` event with ``detail``. Fenced.

        ``actor`` defaults to ``worker:<runtime>`` of the call holding the lease (``dispatcher``
        before a submit).
        """
        if actor is not None:
            check_actor(actor)
        rule = transitions.progress
        return await self._fenced(slug, token, rule, detail=detail, actor=actor) is not None

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
        check_actor(actor)
        given = {"result": result, "result_ref": result_ref, "cost_cents": cost_cents}
        return (
            await self._fenced(slug, token, transitions.complete, actor=actor, **given) is not None
        )

    async def fail(
        self, slug: str, token: str, *, error_code: str, message: str, actor: str
    ) -> bool:
        """Terminal ``failed`` (``CHAIN_EXHAUSTED``, ``LEASE_LOST``, ...), lease cleared,
        ``finished_at`` set (event ``failed``, detail ``{message, terminal: true}``). Fenced.
        """
        check_actor(actor)
        if not error_code:
            raise ValueError("a failed job needs an error code")
        given = {"error_code": error_code, "message": message, "actor": actor}
        return await self._fenced(slug, token, transitions.fail, **given) is not None

    async def cancel_job(self, slug: str, *, actor: str) -> JobRecord | None:
        """``queued | dispatching | running -> cancelled``, lease cleared, ``finished_at`` set
        (event ``cancelled``, naming the call that held the lease). A finished job is returned
        as it is; None for an unknown slug. Not fenced (operator/API verb).
        """
        check_actor(actor)
        now = self._clock.now()
        return await self._noted_change(
            slug, now, partial(transitions.cancel, now=now, actor=actor)
        )

    async def retry_job(self, slug: str, *, actor: str) -> JobRecord | None:
        """``failed -> queued`` (event ``retried``): a fresh drive, so attempts, submit and
        rescue counts start again and the error, ``not_before`` and ``finished_at`` are
        cleared. Any other job is returned as it is; None for an unknown slug. Not fenced.
        """
        check_actor(actor)
        now = self._clock.now()
        return await self._noted_change(slug, now, partial(transitions.retry, now=now, actor=actor))

    async def rescue(
        self, slug: str, token: str, *, max_rescues: int, actor: str = "reaper"
    ) -> JobRecord | None:
        """Take back a lost lease. Fenced (None when the token is stale).

        ``rescue_count + 1`` and back to ``queued`` (event ``rescued``); but when that count
        would exceed ``max_rescues``, terminal ``failed`` with ``LEASE_LOST`` instead. Does not
        look at the expiry: the reaper also rescues calls their runtime reports lost.
        """
        if max_rescues < 0:
            raise ValueError(f"max_rescues must be at least 0, got {max_rescues}")
        check_actor(actor)
        rule = transitions.rescue
        return await self._fenced(slug, token, rule, max_rescues=max_rescues, actor=actor)


def _extend(_job: JobRecord, *, now: datetime, lease_s: float) -> transitions.Change:
    return transitions.extend(now=now, lease_s=lease_s)
