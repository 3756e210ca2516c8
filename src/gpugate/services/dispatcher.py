"""The dispatcher: claims queued jobs and walks each along its runtimes (DESIGN §5, seed 002).

Per claimed job (leased to ``<slug>-dispatcher@<replica>`` for ``dispatcher_lease_s``), the walk of
:class:`~gpugate.core.jobs.ChainWalk` over the job's runner and the fallback chain:

* skip what cannot take it (disabled, another model, no implementation, unreachable, over
  budget, forbidden for a job that may not leave the building, attempts spent); pass over a
  runtime at ``max_concurrency`` (calls leased across replicas) like a busy one;
* per candidate with a budget or a ``max_concurrency``: *reserve* first
  (:meth:`~gpugate.store.ledger.LedgerStore.reserve_call`: the call slot and the estimated
  cost, one atomic step across replicas); no slot is a busy runtime, no room in today's budget
  an ``over_budget`` skip; a submit that fails gives the reservation back;
* per candidate: promote the runner, submit; a retryable failure is retried once in place at
  once, then the walk goes on; a non-retryable one is recorded and the walk goes on;
* success: ``leased_by = "<runtime>:<call_id>"`` (``record_submit``), then the runtime is told
  it may start (:meth:`Runtime.confirm`);
* shed (:class:`GpuSaturated`): the job goes back to the queue, deferred ``GPU_SATURATED``;
* busy (a 429, :class:`RuntimeBusy`) is no failed attempt (issue #14 defect 3): the walk goes on,
  and a job with no room anywhere is deferred ``RUNTIME_BUSY`` for a jittered backoff
  (:class:`~gpugate.retry.Backoff`, growing with the consecutive busy answers); the runtime's
  limit is learned from its 429s (:class:`~gpugate.core.jobs.LearnedConcurrency`: halved on a
  429, raised again as submits succeed, never above ``max_concurrency``), so the gateway stops
  sending a worker more calls than it takes. A job that finds no room for
  ``jobs.busy_deadline_s`` after it was created fails ``BUSY_DEADLINE``;
* no room anywhere: deferred ``AT_CAPACITY`` for a short backoff — and sooner, when a call
  finishes (:meth:`Dispatcher.slot_freed`);
* nothing left: ``fail`` with ``CHAIN_EXHAUSTED`` naming each runtime's last error (or
  ``EXTERNAL_UPSTREAM_FORBIDDEN`` when only that kept it from running).

Stop conditions it sees (``on_stop(runtime, condition, reason)`` disables and drains): a 401/403
on submit (``auth_error``, when ``disable_on_auth_error``), and a job taken back by the reaper
(a lost call) that was submitted ``max_submits_per_job`` times already (``max_submits``: the
runtime of its last submit is stopped, and the job fails ``SUBMIT_LIMIT`` instead of being
submitted once more). A job that walks on because its runtime was drained or refused it is
not a resubmission loop, so only jobs that came back from a rescue are counted.

Every write carries the claim's lease token; a stale token means another dispatcher or the
reaper owns the job now, and this one lets it go at once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from datetime import datetime, timedelta
from typing import Literal, Protocol, TypeVar

from gpugate.clock import Clock, sleep_or_wake
from gpugate.config import GatewayConfig
from gpugate.core.budget import BUDGET_FACTOR, Cost
from gpugate.core.jobs import (
    ATTEMPTS_SPENT,
    SUBMIT_LIMIT,
    ChainWalk,
    Defer,
    Exhausted,
    LearnedConcurrency,
    RuntimeView,
    Submit,
    saturated_until,
)
from gpugate.errors import (
    GpugateError,
    GpuSaturated,
    RuntimeAuthFailed,
    RuntimeBusy,
    RuntimeFailure,
    StaleLease,
    StoreError,
)
from gpugate.retry import Backoff
from gpugate.services.runtimes.base import Runtime, Submission
from gpugate.store import JobEvent, JobRecord, JobStore
from gpugate.store.ledger import LedgerStore
from gpugate.telemetry import (
    NO_SPAN,
    NO_TRACER,
    Span,
    Tracer,
    dispatch_ended,
    job_span,
    runtime_span,
)

log = logging.getLogger("gpugate.dispatcher")
_T = TypeVar("_T")

ACTOR = "dispatcher"
Outcome = Literal["dispatched", "deferred", "failed", "stale", "error"]
#: ``metrics(outcome, runtime)``: called once per dispatched job; runtime "" when none took it.
DispatchMetrics = Callable[[Outcome, str], None]
#: ``on_stop(runtime, condition, reason)``: a stop condition fired (disable and drain it).
StopHook = Callable[[str, str, str], Awaitable[object]]


@dataclass(frozen=True, slots=True)
class DispatchReport:
    """What one :meth:`Dispatcher.tick` (or :meth:`Dispatcher.dispatch_one`) did.

    ``walked`` counts the moves of a job's runner to the next runtime of its chain; ``stale``
    the jobs another owner took over meanwhile; ``errors`` the jobs whose dispatch broke on
    something unexpected (logged; their lease runs out and the reaper takes them back).
    """

    claimed: int = 0
    dispatched: int = 0
    walked: int = 0
    deferred: int = 0
    failed: int = 0
    stale: int = 0
    errors: int = 0

    def __add__(self, other: DispatchReport) -> DispatchReport:
        return DispatchReport(
            *(getattr(self, f.name) + getattr(other, f.name) for f in fields(self))
        )


@dataclass(slots=True)
class _Tally:
    walked: int = 0


@dataclass(frozen=True, slots=True)
class _Submitted:
    """A runtime took the job; the call is still to be recorded."""

    runtime: str
    token: str
    submission: Submission


class DispatchStore(JobStore, LedgerStore, Protocol):
    """The slice of the store the dispatcher uses: the jobs, and the ledger's call slots."""


class Dispatcher:
    """Claims jobs and submits them along their chain; see the module docstring.

    ``views()`` describes every runtime (:func:`gpugate.core.jobs.runtime_views`); the
    dispatcher fills in ``leased`` itself from the store. ``config`` is the config in effect,
    or a function answering it (the gateway config changes by version).
    """

    def __init__(  # noqa: PLR0913 - the dispatcher's collaborators and its few knobs
        self,
        store: DispatchStore,
        runtimes: Mapping[str, Runtime],
        views: Callable[[], Mapping[str, RuntimeView]],
        config: GatewayConfig | Callable[[], GatewayConfig],
        clock: Clock,
        metrics: DispatchMetrics | None = None,
        *,
        on_stop: StopHook | None = None,
        batch: int = 32,
        capacity_backoff_s: float = 5.0,
        shed_backoff_s: float = 15.0,
        max_batches: int = 100,
        tracer: Tracer = NO_TRACER,
    ) -> None:
        self._store = store
        self._runtimes = runtimes
        self._views = views
        self._config: Callable[[], GatewayConfig] = (
            (lambda: config) if isinstance(config, GatewayConfig) else config
        )
        self._clock = clock
        self._metrics = metrics
        self._on_stop = on_stop
        self._batch = batch
        self._capacity_backoff_s = capacity_backoff_s
        self._shed_backoff_s = shed_backoff_s
        self._max_batches = max_batches
        self._tracer = tracer
        self._event = asyncio.Event()
        self._pending: dict[str, None] = {}
        self._freed = False
        self._due: float | None = None  # monotonic time the earliest deferral here comes due
        self._stopping = False
        self._learned: dict[str, LearnedConcurrency] = {}  # one per capped runtime
        self._busy_streak = 0  # busy answers since a runtime last took a call
        self._busy_backoff = Backoff(min(0.5, capacity_backoff_s), capacity_backoff_s)
        self.totals = DispatchReport()

    # -- waking ----------------------------------------------------------------------------

    def wake(self, slug: str | None = None) -> None:
        """A job was created or re-driven: dispatch it (``slug``) and anything due, at once."""
        if slug is not None and len(self._pending) < self._batch * self._max_batches:
            self._pending[slug] = None
        self._event.set()

    def slot_freed(self) -> None:
        """A call finished: jobs deferred ``AT_CAPACITY`` may run now, before their backoff."""
        self._freed = True
        self._event.set()

    # -- one step --------------------------------------------------------------------------

    async def tick(self) -> DispatchReport:
        """Claim one batch of due jobs and dispatch each; returns what happened."""
        cfg = self._config()
        due_by = None
        if self._freed:  # a slot freed: what waits for one is due now, not after its backoff
            self._freed = False
            due_by = self._clock.now() + timedelta(seconds=self._capacity_backoff_s)
        jobs = await self._store.claim_jobs(
            limit=self._batch, lease_s=cfg.jobs.dispatcher_lease_s, due_by=due_by
        )
        return await self._dispatch_all(jobs)

    async def dispatch_one(self, slug: str) -> DispatchReport:
        """The event-driven path: claim this job if it is due, and dispatch it."""
        cfg = self._config()
        job = await self._store.claim_job(slug, lease_s=cfg.jobs.dispatcher_lease_s)
        return await self._dispatch_all([job] if job is not None else [])

    async def _dispatch_all(self, jobs: Sequence[JobRecord]) -> DispatchReport:
        """Walk each job in turn up to its submit; the calls are recorded together.

        The walks run one after the other (each sees the calls the previous ones took, for
        ``max_concurrency``); recording a call (:meth:`_record`) is left running while the next
        job is walked, so the batch's ``record_submit`` writes reach the store together and are
        group-committed in one transaction instead of one each.
        """
        report = DispatchReport(claimed=len(jobs))
        if jobs:
            views = await self._live_views()
            finishing = [await self._dispatch_safely(job, views) for job in jobs]
            for finished in await asyncio.gather(*finishing):
                report += finished
        self.totals += report
        return report

    async def _live_views(self) -> dict[str, RuntimeView]:
        """The runtimes' views with the calls each has in flight now (capped runtimes only);
        a runtime without an implementation here is marked so."""
        views = dict(self._views())
        for runtime_id, view in views.items():
            if runtime_id not in self._runtimes:
                views[runtime_id] = replace(view, implemented=False)
            elif view.max_concurrency is not None:
                leased = await self._store.count_leased(runtime_id)
                ceiling = view.max_concurrency
                limit = self.learned_limit(runtime_id, ceiling)
                views[runtime_id] = replace(
                    view, leased=leased, max_concurrency=limit, configured_max=ceiling
                )
        return views

    def learned_limit(self, runtime_id: str, ceiling: int) -> int:
        """The limit of calls in flight on ``runtime_id`` learned from its 429s (at most its
        ``max_concurrency``, ``ceiling``)."""
        learned = self._learned.get(runtime_id)
        if learned is None:
            learned = self._learned[runtime_id] = LearnedConcurrency(ceiling)
        elif learned.ceiling != ceiling:
            learned.rebase(ceiling)
        return learned.limit

    def _busy(self, name: str, views: dict[str, RuntimeView]) -> None:
        """``name`` answered busy: lower its learned limit, for this batch's next walks too."""
        self._busy_streak += 1
        view, learned = views.get(name), self._learned.get(name)
        if view is not None and learned is not None:
            learned.refused(in_flight=view.leased)
            views[name] = replace(view, max_concurrency=learned.limit)

    def _took(self, name: str, views: dict[str, RuntimeView]) -> None:
        """``name`` took a call: it counts as in flight for the batch's next walks."""
        self._busy_streak = 0
        view, learned = views.get(name), self._learned.get(name)
        if view is None:
            return
        if learned is not None:
            learned.accepted(in_flight=view.leased)
        views[name] = replace(
            view,
            leased=view.leased + 1,
            max_concurrency=learned.limit if learned is not None else view.max_concurrency,
        )

    async def _dispatch_safely(
        self, job: JobRecord, views: dict[str, RuntimeView]
    ) -> asyncio.Future[DispatchReport]:
        """Walk the job; what is left once it was submitted (recording the call) is the task
        returned, whose result is the job's report."""
        tally = _Tally()
        span = job_span(self._tracer, job.slug, job.model)
        walked = await self._settle(job, self._dispatch(job, views, tally, span))
        took = ("dispatched", walked.runtime) if isinstance(walked, _Submitted) else walked
        dispatch_ended(span, *took)
        if isinstance(walked, _Submitted):
            return asyncio.ensure_future(self._finish(job, walked, tally))
        done: asyncio.Future[DispatchReport] = asyncio.get_running_loop().create_future()
        done.set_result(self._count(walked, tally))
        return done

    async def _finish(self, job: JobRecord, submitted: _Submitted, tally: _Tally) -> DispatchReport:
        record = self._record(job, submitted.token, submitted.runtime, submitted.submission)
        return self._count(await self._settle(job, record), tally)

    @staticmethod
    async def _settle(job: JobRecord, work: Awaitable[_T]) -> _T | tuple[Outcome, str]:
        try:
            return await work
        except StaleLease:
            log.info("job %s: lease taken over while dispatching; letting it go", job.slug)
            return "stale", ""
        except Exception:
            # One job's trouble must not stop the others; its dispatcher lease runs out and
            # the reaper takes it back (counted against max_rescues).
            log.exception("job %s: dispatch failed", job.slug)
            return "error", ""

    def _count(self, settled: tuple[Outcome, str], tally: _Tally) -> DispatchReport:
        outcome, runtime = settled
        if self._metrics is not None:
            self._metrics(outcome, runtime)
        counts = dict.fromkeys(("dispatched", "deferred", "failed", "stale", "errors"), 0)
        counts["errors" if outcome == "error" else outcome] = 1
        return DispatchReport(walked=tally.walked, **counts)

    # -- the walk --------------------------------------------------------------------------

    def _walked(
        self, job: JobRecord, token: str, left: str, to: str, walk: ChainWalk
    ) -> Awaitable[bool]:
        """The job moves on from ``left`` to ``to``; its ``walked`` event says why."""
        return self._store.promote_runner(job.slug, token, to, why=walk.why(left))

    async def _dispatch(
        self, job: JobRecord, views: dict[str, RuntimeView], tally: _Tally, span: Span = NO_SPAN
    ) -> tuple[Outcome, str] | _Submitted:
        """The job's walk up to the runtime that took it (or how it ended without one)."""
        cfg = self._config()
        token = job.lease_token
        assert token is not None, "a claimed job holds a lease token"
        now = self._clock.now()
        walk = ChainWalk(
            job,
            cfg.fallback_chain,
            views,
            now=now,
            max_attempts=cfg.jobs.max_attempts_per_runtime,
            capacity_backoff_s=self._capacity_backoff_s,
            busy_backoff_s=self._busy_backoff.delay(self._busy_streak + 1),
            busy_deadline=job.created_at + timedelta(seconds=cfg.jobs.busy_deadline_s),
        )
        if job.rescue_count and job.submit_count >= cfg.stop_conditions.max_submits_per_job:
            await self._submit_limit(job, token, cfg.stop_conditions.max_submits_per_job)
            return "failed", ""
        runner = job.runner
        step = walk.next()
        while isinstance(step, Submit):
            name = step.runtime
            if name != runner:
                await self._fenced(self._walked(job, token, runner, name, walk))
                runner = name
                tally.walked += 1
            reserved = await self._reserve(job, token, name, views)
            if reserved is not None:
                walk.refused(name, over_budget=reserved == "over_budget")
                step = walk.next()
                continue
            try:
                submission = await self._submit(job, token, name, span)
            except GpuSaturated as exc:
                await self._unreserve(job, token, name, views)
                backoff = exc.retry_after_s or self._shed_backoff_s
                why = walk.reasons() | {name: f"{exc.code}: {exc.message}"}
                await self._defer(job, token, saturated_until(now, backoff, why))
                return "deferred", name
            except RuntimeBusy as exc:  # not a failed attempt: walk on, or wait for room
                await self._unreserve(job, token, name, views)
                self._busy(name, views)
                log.info("job %s: %s is busy: %s", job.slug, name, exc.message)
                walk.failed(name, f"{exc.code}: {exc.message}", retryable=True, busy=True)
                step = walk.next()
                continue
            except GpugateError as exc:
                await self._unreserve(job, token, name, views)
                if isinstance(exc, RuntimeAuthFailed) and cfg.stop_conditions.disable_on_auth_error:
                    await self._stop(name, "auth_error", f"{exc.code} on submit: {exc.message}")
                    views[name] = replace(views[name], enabled=False)
                retryable = isinstance(exc, RuntimeFailure) and exc.retryable
                await self._fenced(
                    self._store.record_attempt_failure(
                        job.slug,
                        token,
                        runtime=name,
                        error_code=exc.code,
                        message=exc.message,
                        retryable=retryable,
                        actor=ACTOR,
                    )
                )
                decision = walk.failed(name, f"{exc.code}: {exc.message}", retryable=retryable)
                step = decision if isinstance(decision, Submit) else walk.next()
                continue
            self._took(name, views)
            return _Submitted(name, token, submission)
        if isinstance(step, Defer):
            await self._defer(job, token, step)
            return "deferred", ""
        await self._exhausted(job, token, walk, step)
        return "failed", ""

    async def _submit(self, job: JobRecord, token: str, name: str, parent: Span) -> Submission:
        """One runtime call, inside its span (a CLIENT span under the job's dispatch)."""
        call = runtime_span(parent, name, job.model)
        try:
            submission = await self._runtimes[name].submit(job, token)
        except BaseException as exc:
            call.end(exc.code if isinstance(exc, GpugateError) else type(exc).__name__)
            raise
        call.end()
        return submission

    def _reserves(
        self, name: str, views: Mapping[str, RuntimeView]
    ) -> tuple[int | None, Cost | None]:
        """What a submit to ``name`` must reserve first: a call slot (its ``max_concurrency``)
        and its estimated cost (its budget); (None, None) for a runtime with neither, which
        pays nothing for the ledger."""
        view = views.get(name)
        limit = view.max_concurrency if view is not None else None
        try:
            budget = self._config().runtime(name).budget
        except KeyError:
            budget = None
        if budget is None:
            return limit, None
        cost = Cost(
            estimate_cents=budget.estimate_cents,
            limit_cents=BUDGET_FACTOR * budget.daily_cents,
            cents_per_second=budget.cents_per_second,
        )
        return limit, cost

    async def _reserve(
        self, job: JobRecord, token: str, name: str, views: dict[str, RuntimeView]
    ) -> str | None:
        """Reserve before the submit; None when reserved (or nothing to reserve), else why not
        (``at_capacity``, ``over_budget``). A stale lease raises :class:`StaleLease`."""
        limit, cost = self._reserves(name, views)
        if limit is None and cost is None:
            return None
        reserved = await self._store.reserve_call(
            job.slug, token, name, max_concurrency=limit, cost=cost
        )
        if reserved == "stale":
            raise StaleLease(f"job {job.slug}: the lease was lost before the submit")
        view = views.get(name)
        if view is not None and reserved != "reserved":
            over = reserved == "over_budget"
            views[name] = replace(
                view,
                over_budget=view.over_budget or over,
                leased=max(view.leased, view.max_concurrency or 0) if not over else view.leased,
            )
        return None if reserved == "reserved" else reserved

    async def _unreserve(
        self, job: JobRecord, token: str, name: str, views: Mapping[str, RuntimeView]
    ) -> None:
        """The submit failed: give back what :meth:`_reserve` took."""
        if self._reserves(name, views) != (None, None):
            await self._store.release_call(job.slug, token, name)

    async def _stop(self, runtime: str, condition: str, reason: str) -> None:
        if self._on_stop is not None:
            await self._on_stop(runtime, condition, reason)

    async def _submit_limit(self, job: JobRecord, token: str, limit: int) -> None:
        """The job was submitted ``limit`` times already: stop the runtime of its last submit
        and fail the job rather than pay for it once more."""
        reason = (
            f"job {job.slug} was submitted {job.submit_count} times (max_submits_per_job {limit})"
        )
        log.error("stop condition: %s; stopping runtime %s", reason, job.runner)
        await self._stop(job.runner, "max_submits", reason)
        await self._fenced(
            self._store.fail(job.slug, token, error_code=SUBMIT_LIMIT, message=reason, actor=ACTOR)
        )

    async def _record(
        self, job: JobRecord, token: str, name: str, submission: Submission
    ) -> tuple[Outcome, str]:
        """Record the call, then let the runtime start it; cancel it if it cannot be recorded."""
        cfg = self._config()
        runtime = self._runtimes[name]
        try:
            recorded = await self._store.record_submit(
                job.slug,
                token,
                runtime=name,
                call_id=submission.call_id,
                lease_s=runtime.call_lease_s or cfg.jobs.quiet_s,
                running=submission.running,
                actor=ACTOR,
                in_process=runtime.kind == "upstream",  # the call lives in this process
            )
        except BaseException:
            await runtime.cancel(submission.call_id)
            raise
        if not recorded:
            await runtime.cancel(submission.call_id)
            raise StaleLease(f"job {job.slug}: the call {submission.call_id} was not recorded")
        await runtime.confirm(submission.call_id)
        return "dispatched", name

    async def _defer(self, job: JobRecord, token: str, defer: Defer) -> None:
        await self._fenced(
            self._store.release(
                job.slug,
                token,
                not_before=defer.not_before,
                status="deferred",
                error_code=defer.reason,
                actor=ACTOR,
                why=defer.why,
            )
        )
        self._remember_due(defer.not_before)

    async def _exhausted(
        self, job: JobRecord, token: str, walk: ChainWalk, exhausted: Exhausted
    ) -> None:
        errors = dict(exhausted.errors)
        spent = [r for r, why in walk.skipped.items() if why == ATTEMPTS_SPENT]
        if spent:  # their errors are from earlier walks: the events hold them
            earlier = last_errors(await self._store.job_events(job.slug))
            for runtime in spent:
                if runtime in earlier and runtime in errors:
                    errors[runtime] = f"{earlier[runtime]} (attempts spent)"
        message = Exhausted(exhausted.code, errors).message
        await self._fenced(
            self._store.fail(
                job.slug, token, error_code=exhausted.code, message=message, actor=ACTOR
            )
        )

    @staticmethod
    async def _fenced(write: Awaitable[bool]) -> None:
        if not await write:
            raise StaleLease

    def _remember_due(self, not_before: datetime) -> None:
        delay = max(0.0, (not_before - self._clock.now()).total_seconds())
        due = self._clock.monotonic() + delay
        self._due = due if self._due is None else min(self._due, due)

    # -- the loop --------------------------------------------------------------------------

    async def run(self) -> None:
        """Dispatch on every wake-up, on every deferral coming due, and every ``sweep_s``;
        return once :meth:`stop` was called and the pass under way is done."""
        while not self._stopping:
            try:
                await self.drain()
            except StoreError:
                log.exception("dispatcher: the store failed; trying again at the next sweep")
            except Exception:  # one bad pass must not end the loop (issue #17): next sweep
                log.exception("dispatcher: a pass broke; trying again at the next sweep")
            if not self._stopping:
                await self._wait()

    def stop(self) -> None:
        """Claim nothing more: :meth:`run` returns after the job it is walking (a draining
        replica; cancelling it instead could leave a recorded call that never starts)."""
        self._stopping = True
        self._event.set()

    async def drain(self) -> DispatchReport:
        """Dispatch the job named by a lone wake-up, then due batches until the queue is dry
        (at most ``max_batches``).

        One pending job (the idle case) is claimed by name, for the lowest latency. A burst of
        wake-ups is left to the batches, which claim every due job, the named ones included,
        ``batch`` per statement: one claim per job would starve the dispatcher behind the
        creates that keep arriving.
        """
        self._event.clear()
        if self._stopping:
            self._pending.clear()
            return DispatchReport()
        if self._due is not None and self._clock.monotonic() >= self._due:
            self._due = None
        report = DispatchReport()
        if len(self._pending) == 1:
            report += await self.dispatch_one(next(iter(self._pending)))
        self._pending.clear()
        for _ in range(self._max_batches):
            if self._stopping:  # stopped while this pass ran
                break
            batch = await self.tick()
            report += batch
            if batch.claimed < self._batch:
                break
        return report

    async def _wait(self) -> None:
        timeout = self._config().jobs.sweep_s
        if self._due is not None:
            timeout = min(timeout, max(0.0, self._due - self._clock.monotonic()))
        await sleep_or_wake(self._clock, self._event, timeout)

    def __repr__(self) -> str:
        t = self.totals
        return (
            f"<Dispatcher dispatched={t.dispatched} walked={t.walked} "
            f"deferred={t.deferred} failed={t.failed}>"
        )


def last_errors(events: Sequence[JobEvent]) -> dict[str, str]:
    """Each runtime's last failed attempt in a job's events, as ``"CODE: message"``."""
    errors: dict[str, str] = {}
    for event in events:
        if event.status == "failed" and event.runtime and event.error_code:
            message = event.detail.get("message")
            errors[event.runtime] = (
                f"{event.error_code}: {message}" if message else event.error_code
            )
    return errors
