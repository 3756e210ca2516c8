"""Deferral, wake-ups and fencing: a job waits instead of failing, and a late writer is ignored."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from datetime import timedelta

from jobs_rig import Rig, ScriptedRuntime, push_runtime, rig

from gpugate.errors import RuntimeBusy
from gpugate.services.gpu_monitor import GpuMonitor
from gpugate.store import JobRecord
from harness import eventually

SHED = {"poll_s": 3600, "staleness_s": 60, "sustained_samples": 2, "shed_batch": True}


async def poll(r: Rig, times: int) -> None:
    monitor = r.gateway.monitor
    assert isinstance(monitor, GpuMonitor)
    for _ in range(times):
        r.clock.advance(15)
        await monitor.tick()


@contextlib.asynccontextmanager
async def running(r: Rig) -> AsyncIterator[asyncio.Task[None]]:
    """The dispatcher's loop, started and waiting on its clock before the block begins."""
    loops = len(r.gateway.loops._tasks)  # the gateway's own loops, each asleep on the clock
    await eventually(lambda: len(r.clock._sleepers) >= loops, what="the gateway's loops wait")
    baseline = len(r.clock._sleepers)  # so the next sleeper is the dispatcher's, not a late one
    task = asyncio.create_task(r.dispatcher.run())
    await eventually(lambda: len(r.clock._sleepers) > baseline, what="the dispatcher waits")
    try:
        yield task
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_shed_job_is_deferred_and_completes_once_the_saturation_clears(dsn: str) -> None:
    async with rig(dsn, gpu_health=SHED) as r:
        assert r.exporter is not None
        r.exporter.set_gpu(0, util=99)
        await poll(r, 2)
        await r.submit("j1", key="k1")
        shed_at = r.clock.now()
        report = await r.dispatcher.tick()
        deferred = await r.job("j1")
        resubmitted = await r.submit("j1", key="k1")
        r.exporter.set_gpu(0, util=20)
        r.clock.advance(3600 - 60)
        await poll(r, 4)
        await r.dispatcher.tick()
        await r.idle()
        done = await r.job("j1")
        trail = await r.trail("j1")
    assert 1 == report.deferred
    assert ("queued", shed_at + timedelta(seconds=3600)) == (deferred.state, deferred.not_before)
    assert ("j1", "queued") == (resubmitted.slug, resubmitted.state)
    assert ("deferred", "local", "GPU_SATURATED") in trail
    assert ("completed", 1) == (done.state, done.submit_count)
    assert {"j1": 1} == r.executions()


async def test_at_capacity_a_job_is_deferred_and_dispatched_as_soon_as_a_slot_frees(
    dsn: str,
) -> None:
    runtimes = [{"id": "local", "kind": "upstream", "max_concurrency": 1}]
    async with rig(dsn, runtimes=runtimes) as r:
        r.servers["q0"].update(hang=True)
        await r.submit("a")
        await r.submit("b")
        first = await r.dispatcher.tick()
        waiting = await r.job("b")
        r.servers["q0"].update(hang=False)
        await r.idle()
        second = await r.dispatcher.drain()  # no clock moved: the freed slot woke it
        await r.idle()
        trail = await r.trail("b")
        states = ((await r.job("a")).state, (await r.job("b")).state)
    assert (1, 1) == (first.dispatched, first.deferred)
    assert ("queued", r.clock.now() + timedelta(seconds=5)) == (
        waiting.state,
        waiting.not_before,
    )
    assert ("deferred", "local", "AT_CAPACITY") in trail
    assert 1 == second.dispatched
    assert ("completed", "completed") == states
    assert {"a": 1, "b": 1} == r.executions()


async def test_a_job_dispatched_early_because_a_slot_freed_is_stamped_with_the_time_it_happened(
    dsn: str,
) -> None:
    """Issue 14 defect 11: the claim after a slot frees looks ahead for jobs waiting for one,
    but its ``dispatching`` event and its lease start now, so the timeline stays in order."""
    runtimes = [{"id": "local", "kind": "upstream", "max_concurrency": 1}]
    async with rig(dsn, runtimes=runtimes) as r:
        await r.submit("a")
        await r.submit("b")
        await r.dispatcher.tick()
        await r.idle()  # a completes, b waits AT_CAPACITY for 5 s: the slot freed meanwhile
        r.clock.advance(1)
        claimed_at = r.clock.now()
        await r.dispatcher.drain()
        await r.idle()
        events = await r.events("b")
    dispatching = [e for e in events if e.status == "dispatching"]
    assert claimed_at == dispatching[-1].at
    assert sorted(events, key=lambda e: e.at) == events


async def test_a_runtime_at_capacity_is_passed_over_for_the_next_in_the_chain(dsn: str) -> None:
    """The audit trail says why: the ``walked`` event names the capacity, not "not in the
    chain" (the runtime passed over is the job's runner, first in its chain)."""
    runtimes = [{"id": "local", "kind": "upstream", "max_concurrency": 1}, push_runtime("home-1")]
    async with rig(dsn, runtimes=runtimes, chain=["local", "home-1"]) as r:
        r.servers["q0"].update(hang=True)
        await r.submit("a")
        await r.submit("b")
        await r.dispatcher.tick()
        b = await r.job("b")
        (walked,) = [e for e in await r.events("b") if e.status == "walked"]
        r.servers["q0"].update(hang=False)
    assert ("home-1", "home-1:home-1-call-1") == (b.runner, b.leased_by)
    assert {"from": "local", "why": "AT_CAPACITY: 1 of 1 calls in flight"} == walked.detail


async def test_a_deferral_says_what_kept_each_runtime_from_the_job(dsn: str) -> None:
    runtimes = [
        push_runtime("home-1", max_concurrency=1),
        push_runtime("home-2"),
        {"id": "local", "kind": "upstream"},
    ]
    chain = ["home-1", "home-2", "local"]
    async with rig(dsn, runtimes=runtimes, chain=chain, default="home-1") as r:
        r.disabled.add("home-2")
        r.unreachable.add("local")
        await r.submit("a")
        await r.submit("b")
        await r.dispatcher.tick()
        (deferred,) = [e for e in await r.events("b") if e.status == "deferred"]
    assert ("AT_CAPACITY", "home-1") == (deferred.error_code, deferred.runtime)
    assert {
        "home-1": "AT_CAPACITY: 1 of 1 calls in flight",
        "home-2": "disabled",
        "local": "unreachable",
    } == deferred.detail["why"]


async def test_a_woken_dispatcher_runs_a_new_job_at_once(dsn: str) -> None:
    async with rig(dsn) as r, running(r):
        await r.submit("j1")
        r.dispatcher.wake("j1")
        job = await r.until("j1", "completed")
    assert 1 == job.submit_count


async def test_the_sweep_dispatches_a_job_whose_wake_up_was_lost(dsn: str) -> None:
    async with rig(dsn) as r, running(r):
        await r.submit("j1")  # and nobody calls wake()
        await asyncio.sleep(0.05)
        before = (await r.job("j1")).state
        r.clock.advance(60)  # jobs.sweep_s
        job = await r.until("j1", "completed")
    assert "queued" == before
    assert 1 == job.submit_count


async def test_a_deferred_job_is_dispatched_by_the_loop_when_its_backoff_ends(dsn: str) -> None:
    runtimes = [push_runtime("home-1", max_concurrency=1)]
    async with rig(dsn, runtimes=runtimes) as r:
        await r.submit("a")
        await r.submit("b")
        await r.dispatcher.tick()  # a runs on home-1, b waits for a slot
        a = await r.job("a")
        assert a.lease_token is not None
        async with running(r):
            await r.store.complete("a", a.lease_token, result={}, actor="worker:home-1")
            await r.dispatcher.tick()  # a pass now takes nothing: b's backoff has not ended
            before = (await r.job("b")).state
            r.clock.advance(5)  # the AT_CAPACITY backoff, well before the sweep
            b = await r.until("b", "dispatching", submitted=True)
    assert "queued" == before
    assert "home-1:home-1-call-2" == b.leased_by


async def test_when_the_lease_is_taken_over_during_a_submit_the_call_is_cancelled(
    dsn: str,
) -> None:
    runtimes = [push_runtime("home-1")]
    async with rig(dsn, runtimes=runtimes) as r:
        home = r.scripted("home-1")
        tokens: list[str] = []

        async def reaper_takes_it_back(job: JobRecord, token: str) -> None:
            tokens.append(token)
            await r.store.rescue(job.slug, token, max_rescues=3)

        home.during_submit = reaper_takes_it_back
        await r.submit("j1")
        report = await r.dispatcher.tick()
        job = await r.job("j1")
        late = await r.store.complete("j1", tokens[0], result={"late": True}, actor="dispatcher")
        after = await r.job("j1")
    assert 1 == report.stale
    assert (["home-1-call-1"], []) == (home.cancelled, home.confirmed)
    assert ("queued", 0, 1) == (job.state, job.submit_count, job.rescue_count)
    assert not late
    assert ("queued", None) == (after.state, after.result)


async def test_a_call_that_ends_after_its_job_was_cancelled_changes_nothing(dsn: str) -> None:
    async with rig(dsn) as r:
        r.servers["q0"].update(hang=True)
        await r.submit("j1")
        await r.dispatcher.tick()
        await eventually(lambda: r.servers["q0"].stats.open_requests == 1, what="call started")
        await r.store.cancel_job("j1", actor="api")
        r.servers["q0"].update(hang=False)
        await r.idle()
        job = await r.job("j1")
    assert ("cancelled", None) == (job.state, job.result)
    assert 0 == r.local.completed


async def test_a_stopped_dispatcher_returns_from_its_loop_and_claims_nothing_more(
    dsn: str,
) -> None:
    async with rig(dsn) as r, running(r) as task:
        r.dispatcher.stop()
        await asyncio.wait_for(task, timeout=5)  # returns by itself: not cancelled
        await r.submit("j1", key="k1")
        r.dispatcher.wake("j1")  # nobody acts on it now
        report = await r.dispatcher.drain()
        job = await r.job("j1")

    assert task.done()
    assert not task.cancelled()
    assert (0, "queued") == (report.claimed, job.state)


async def test_a_busy_worker_spends_no_attempt_and_the_job_runs_once_capacity_returns(
    dsn: str,
) -> None:
    """Issue 14 defect 3: a push worker at its ``--concurrency`` answers 429 again and again;
    on main the second walk found the attempts spent and failed the job ``CHAIN_EXHAUSTED``.
    Busy is no failed attempt: the job waits ``RUNTIME_BUSY`` and runs when the worker has room."""
    runtimes = [push_runtime("home-1", max_concurrency=4)]
    async with rig(dsn, runtimes=runtimes, chain=["home-1"], default="home-1") as r:
        home = r.scripted("home-1")
        home.script = [RuntimeBusy("429 from the worker")] * 5
        await r.submit("j1")
        for _ in range(5):
            report = await r.dispatcher.drain()
            waiting = await r.job("j1")
            assert (1, "queued") == (report.deferred, waiting.state)
            assert waiting.not_before is not None
            r.clock.advance(max(0.0, (waiting.not_before - r.clock.now()).total_seconds()))
        taken = await r.dispatcher.drain()
        job = await r.job("j1")
        trail = await r.trail("j1")
    assert 1 == taken.dispatched
    assert job.call is not None
    assert ("home-1", {"home-1": 1}) == (job.call[0], job.attempts)
    assert 5 == trail.count(("deferred", "home-1", "RUNTIME_BUSY"))
    assert [] == [code for status, _, code in trail if status == "failed"]
    assert ["j1"] * 6 == home.submits


async def test_a_job_busy_past_its_deadline_fails_busy_deadline_naming_the_runtime(
    dsn: str,
) -> None:
    runtimes = [push_runtime("home-1", max_concurrency=4)]
    jobs = {"busy_deadline_s": 30}
    async with rig(dsn, runtimes=runtimes, chain=["home-1"], default="home-1", jobs=jobs) as r:
        r.scripted("home-1").script = [RuntimeBusy("429 from the worker")] * 2
        await r.submit("j1")
        await r.dispatcher.drain()
        r.clock.advance(30)
        await r.dispatcher.drain()
        job = await r.job("j1")
    assert ("failed", "BUSY_DEADLINE") == (job.state, job.error_code)
    assert "home-1: busy past the deadline (RUNTIME_BUSY: 429 from the worker)" == (
        job.error_message
    )


async def test_a_429_teaches_the_dispatcher_the_workers_real_concurrency(dsn: str) -> None:
    """A worker of concurrency 1 behind ``max_concurrency: 4``: the second submit is refused
    with one call out, so the learned limit is 1 and the batch's other jobs wait without a
    submit (no 429 for each of them)."""
    runtimes = [push_runtime("home-1", max_concurrency=4)]
    async with rig(dsn, runtimes=runtimes, chain=["home-1"], default="home-1") as r:
        home = r.scripted("home-1")
        home.script = [None, RuntimeBusy("429 from the worker")]
        for slug in ("a", "b", "c", "d"):
            await r.submit(slug)
        report = await r.dispatcher.tick()
        trails = {slug: await r.trail(slug) for slug in ("b", "c", "d")}
        (deferred,) = [e for e in await r.events("c") if e.status == "deferred"]
    assert (1, 3) == (report.dispatched, report.deferred)
    learned = (
        "AT_CAPACITY: 1 of 1 calls in flight (a limit learned from its 429s; max_concurrency 4)"
    )
    assert {"home-1": learned} == deferred.detail["why"]
    assert ["a", "b"] == home.submits
    assert 1 == r.dispatcher.learned_limit("home-1", 4)
    assert ("deferred", "home-1", "RUNTIME_BUSY") in trails["b"]
    assert ("deferred", "home-1", "AT_CAPACITY") in trails["c"]
    assert ("deferred", "home-1", "AT_CAPACITY") in trails["d"]


async def test_after_one_429_the_learned_limit_grows_back_to_max_concurrency_on_successes(
    dsn: str,
) -> None:
    """A worker refuses once (the learned limit halves to 1 of 2); the calls it then takes
    one at a time, each at the limit, raise it by one after ``probe_after`` x limit of them:
    eight completed jobs later two calls run at once again, with no restart."""
    runtimes = [push_runtime("home-1", max_concurrency=2)]
    async with rig(dsn, runtimes=runtimes, chain=["home-1"], default="home-1") as r:
        home = r.scripted("home-1")
        home.script = [None, RuntimeBusy("429 from the worker")]
        await r.submit("a")
        await r.submit("b")
        await r.dispatcher.tick()
        after_429 = r.dispatcher.learned_limit("home-1", 2)
        limits = []
        for n in range(9):
            await finish_calls(r, home)
            r.clock.advance(10)  # past any backoff: the next job runs at once
            if n:
                await r.submit(f"j{n}")
            await r.dispatcher.tick()
            limits.append(r.dispatcher.learned_limit("home-1", 2))
        await finish_calls(r, home)
        for slug in ("x", "y"):
            await r.submit(slug)
        both = await r.dispatcher.tick()
    assert 1 == after_429
    assert [1] * 7 + [2, 2] == limits
    assert (2, 0) == (both.dispatched, both.deferred)


async def finish_calls(r: Rig, runtime: ScriptedRuntime) -> None:
    """Complete every call ``runtime`` holds, as its worker would report them."""
    for slug, token in list(runtime.calls.values()):
        await r.store.complete(slug, token, result={}, actor=f"worker:{runtime.id}")
    runtime.calls.clear()
