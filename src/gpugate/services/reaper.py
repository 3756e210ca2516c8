"""The reaper: takes back the leases their holders let lapse, asking the runtime first.

Every ``reap_s`` it lists the jobs whose lease expired (:meth:`JobStore.expired_leases`):

* a dispatcher's lease (``<slug>-dispatcher@<replica>``: the dispatching process died) → ``rescue``;
* a call (``<runtime>:<call_id>``) → the runtime's :meth:`~Runtime.status` **first**, so no work
  that is still running or already done is paid for twice:
  ``completed`` → complete the job with the call's result; ``running``/``queued`` → extend the
  lease by ``quiet_s`` (a call extended ``stuck_after`` times in a row counts once as *stuck* in
  :attr:`Reaper.stuck_by_runtime`, the count the stop conditions read); ``failed`` → the
  attempt is recorded and the job goes back to the queue to walk on (or fails, when the call
  says the job itself is at fault); ``unknown`` or a runtime no longer configured → ``rescue``.
  A runtime that cannot say (its status raises) keeps the call: the lease is extended and the
  call may become stuck, but it is never run a second time on a guess.

``rescue`` puts the job back in the queue with ``rescue_count + 1``, or fails it ``LEASE_LOST``
past ``jobs.max_rescues``. A job whose lease is still the dispatcher's slot reservation
(``<runtime>:~reserved``: the process died between reserving and recording the submit) is
rescued the same way, without asking the runtime about a call that never existed.

**Drain.** Each tick first drains the runtimes ``draining()`` names (drained, or stopped by a
stop condition): every call in flight on one is cancelled (:meth:`Runtime.cancel`), an attempt
failure ``RUNTIME_DRAINED`` is recorded (not retryable; no rescue is counted) and the job goes
back to the queue, where its walk skips the disabled runtime and goes on along the chain.
After each tick ``on_stuck(stuck_by_runtime)`` lets the stop conditions look at the stuck count.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass, fields
from datetime import datetime, timedelta
from typing import Literal

from gpugate.clock import Clock
from gpugate.config import GatewayConfig
from gpugate.core.jobs import RUNTIME_DRAINED
from gpugate.core.lease import RESERVED_CALL
from gpugate.errors import GpugateError, RuntimeFailure, StoreError
from gpugate.services.results import Results
from gpugate.services.runtimes.base import CallStatus, Runtime
from gpugate.store import JobRecord, JobStore

log = logging.getLogger("gpugate.reaper")

ACTOR = "reaper"
_Outcome = Literal["completed", "extended", "released", "failed", "rescued", "lost", "stale"]
_OUTCOMES: tuple[_Outcome, ...] = (
    "completed",
    "extended",
    "released",
    "failed",
    "rescued",
    "lost",
    "stale",
)
_MEMORY = 10_000  # quiet calls remembered for the stuck count


@dataclass(frozen=True, slots=True)
class ReapReport:
    """What one :meth:`Reaper.tick` did with the expired leases it found."""

    expired: int = 0
    completed: int = 0
    extended: int = 0
    released: int = 0
    failed: int = 0
    rescued: int = 0
    lost: int = 0
    stale: int = 0
    stuck: int = 0
    drained: int = 0

    def __add__(self, other: ReapReport) -> ReapReport:
        return ReapReport(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(self)))


class Reaper:
    """Reaps expired leases; see the module docstring."""

    def __init__(  # noqa: PLR0913 - the reaper's collaborators and its hooks
        self,
        store: JobStore,
        runtimes: Mapping[str, Runtime],
        config: GatewayConfig | Callable[[], GatewayConfig],
        clock: Clock,
        *,
        on_released: Callable[[], None] | None = None,
        draining: Callable[[], Collection[str]] | None = None,
        on_stuck: Callable[[Mapping[str, int]], Awaitable[None]] | None = None,
        on_drained: Callable[[str], None] | None = None,
        stuck_after: int = 5,
        limit: int = 100,
        results: Results | None = None,
    ) -> None:
        self._store = store
        self._results = results or Results()  # Results(): every result inline
        self._runtimes = runtimes
        self._config: Callable[[], GatewayConfig] = (
            (lambda: config) if isinstance(config, GatewayConfig) else config
        )
        self._clock = clock
        #: Called when a job went back to the queue or finished (wiring: ``slot_freed``).
        self.on_released = on_released
        self._draining = draining
        self._on_stuck = on_stuck
        self._on_drained = on_drained
        self._stuck_after = stuck_after
        self._limit = limit
        self._quiet: dict[tuple[str, str], int] = {}  # (slug, call_id) -> extensions in a row
        #: Calls found stuck, per runtime (each call counted once).
        self.stuck_by_runtime: dict[str, int] = {}
        self.totals = ReapReport()

    async def tick(self, *, now: datetime | None = None) -> ReapReport:
        """Reap every lease expired at ``now`` (default: the store's clock), up to ``limit``."""
        report = ReapReport(drained=await self._drain())
        jobs = await self._store.expired_leases(now=now, limit=self._limit)
        report += ReapReport(expired=len(jobs))
        for job in jobs:
            report += await self._reap_safely(job)
        self.totals += report
        if self.on_released is not None and (
            report.completed
            or report.released
            or report.failed
            or report.rescued
            or report.lost
            or report.drained
        ):
            self.on_released()
        if self._on_stuck is not None and report.stuck:
            await self._on_stuck(self.stuck_by_runtime)
        return report

    async def _drain(self) -> int:
        """Cancel the calls in flight on every draining runtime; their jobs walk on."""
        if self._draining is None:
            return 0
        drained = 0
        for runtime_id in self._draining():
            for state in ("dispatching", "running"):
                page = await self._store.list_jobs(state=state, runner=runtime_id, limit=500)
                for job in page.jobs:
                    drained += await self._drain_call(job, runtime_id)
        return drained

    async def _drain_call(self, job: JobRecord, runtime_id: str) -> int:
        """Cancel one call of a draining runtime and send its job on; 1 when it went back."""
        call = job.call
        if call is None or call[0] != runtime_id or call[1] == RESERVED_CALL:
            return 0  # the dispatcher holds it: it sees the runtime disabled and walks on
        runtime = self._runtimes.get(runtime_id)
        if runtime is not None:
            try:
                await runtime.cancel(call[1])
            except GpugateError as exc:
                log.warning("job %s: cancelling call %s failed: %s", job.slug, call[1], exc)
        token = _token(job)
        message = f"{runtime_id} was drained; the call was cancelled and the job walks on"
        recorded = await self._store.record_attempt_failure(
            job.slug,
            token,
            runtime=runtime_id,
            error_code=RUNTIME_DRAINED,
            message=message,
            retryable=False,
            actor=ACTOR,
        )
        if not (
            recorded
            and await self._store.release(job.slug, token, error_code=RUNTIME_DRAINED, actor=ACTOR)
        ):
            return 0
        log.info(
            "job %s: call %s on drained %s cancelled; walking on", job.slug, call[1], runtime_id
        )
        if self._on_drained is not None:
            self._on_drained(runtime_id)
        return 1

    async def recover(self) -> ReapReport:
        """At start-up of a lone process (SQLite): every lease left is from a process that died,
        so reap them all now instead of after they expire. Never with replicas sharing a store:
        it would take over the live dispatcher leases of the others."""
        horizon = self._config().jobs.dispatcher_lease_s + self._config().jobs.quiet_s
        now = self._clock.now() + timedelta(seconds=horizon)
        report = ReapReport()
        while True:  # every lease, not one page of them
            page = await self.tick(now=now)
            report += page
            settled = page.expired - page.extended - page.stuck  # rows that left the page
            if page.expired < self._limit or settled <= 0:
                return report

    async def run(self) -> None:
        """Reap every ``reap_s``."""
        while True:
            try:
                await self.tick()
            except StoreError:
                log.exception("reaper: the store failed; trying again in reap_s")
            await self._clock.sleep(self._config().jobs.reap_s)

    async def _reap_safely(self, job: JobRecord) -> ReapReport:
        try:
            outcome = await self._reap(job)
        except StoreError:
            raise
        except Exception:
            log.exception("job %s: reaping failed; trying again next time", job.slug)
            outcome = "stale"
        counts = dict.fromkeys(_OUTCOMES, 0)
        counts[outcome] += 1
        stuck = 0
        call = job.call
        if outcome == "extended" and call is not None:
            stuck = self._count_quiet(job.slug, *call)
        elif call is not None:
            self._quiet.pop((job.slug, call[1]), None)
        return ReapReport(stuck=stuck, **counts)

    async def _reap(self, job: JobRecord) -> _Outcome:
        call = job.call
        if call is None:  # a dispatcher's lease: the process dispatching it died
            return await self._rescue(job)
        runtime_id, call_id = call
        if call_id == RESERVED_CALL:  # a slot reserved by a dispatcher that died before the submit
            return await self._rescue(job)
        runtime = self._runtimes.get(runtime_id)
        if runtime is None:
            log.warning("job %s: runtime %s is gone; rescuing", job.slug, runtime_id)
            return await self._rescue(job)
        try:
            status = await runtime.status(call_id)
        except RuntimeFailure as exc:
            log.warning(
                "job %s: %s cannot say how call %s is: %s", job.slug, runtime_id, call_id, exc
            )
            return await self._extend(job, runtime)
        return await self._settle(job, runtime_id, status)

    async def _settle(self, job: JobRecord, runtime_id: str, status: CallStatus) -> _Outcome:
        token = _token(job)
        store = self._store
        match status.state:
            case "completed":
                done = await self._results.complete(
                    store, job.slug, token, status.result, cost_cents=status.cost_cents, actor=ACTOR
                )
                return "completed" if done else "stale"
            case "running" | "queued":
                return await self._extend(job, self._runtimes.get(runtime_id))
            case "failed":
                code = status.error_code or "RUNTIME_CALL_FAILED"
                message = status.message or f"{runtime_id} reported the call failed"
                if status.terminal:
                    failed = await store.fail(
                        job.slug, token, error_code=code, message=message, actor=ACTOR
                    )
                    return "failed" if failed else "stale"
                recorded = await store.record_attempt_failure(
                    job.slug,
                    token,
                    runtime=runtime_id,
                    error_code=code,
                    message=message,
                    retryable=status.retryable,
                    actor=ACTOR,
                )
                released = recorded and await store.release(
                    job.slug, token, error_code=code, actor=ACTOR
                )
                return "released" if released else "stale"
            case "unknown":
                return await self._rescue(job)

    async def _extend(self, job: JobRecord, runtime: Runtime | None) -> _Outcome:
        """Give the call another lease: the runtime's own, else ``jobs.quiet_s``."""
        lease_s = (runtime.call_lease_s if runtime else None) or self._config().jobs.quiet_s
        until = await self._store.extend_lease(job.slug, _token(job), lease_s=lease_s)
        return "extended" if until is not None else "stale"

    async def _rescue(self, job: JobRecord) -> _Outcome:
        max_rescues = self._config().jobs.max_rescues
        rescued = await self._store.rescue(job.slug, _token(job), max_rescues=max_rescues)
        if rescued is None:
            return "stale"
        return "lost" if rescued.state == "failed" else "rescued"

    def _count_quiet(self, slug: str, runtime_id: str, call_id: str) -> int:
        """One more extension of a quiet call; 1 when that makes it stuck (counted once)."""
        key = (slug, call_id)
        times = self._quiet.pop(key, 0) + 1
        self._quiet[key] = times  # re-inserted: the dict stays oldest-first
        while len(self._quiet) > _MEMORY:
            del self._quiet[next(iter(self._quiet))]
        if times != self._stuck_after:
            return 0
        self.stuck_by_runtime[runtime_id] = self.stuck_by_runtime.get(runtime_id, 0) + 1
        log.warning("job %s: call %s on %s is stuck", slug, call_id, runtime_id)
        return 1

    def __repr__(self) -> str:
        t = self.totals
        return (
            f"<Reaper expired={t.expired} completed={t.completed} extended={t.extended} "
            f"rescued={t.rescued} lost={t.lost} stuck={sum(self.stuck_by_runtime.values())}>"
        )


def _token(job: JobRecord) -> str:
    token: str | None = job.lease_token
    assert token is not None, "an expired lease still holds its token"
    return token
