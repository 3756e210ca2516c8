"""The reaper takes back lapsed leases, asking the runtime about the call first."""

from __future__ import annotations

import asyncio

from jobs_rig import push_runtime, rig

from gpugate.services.reaper import Reaper
from gpugate.services.runtimes import CallStatus, UpstreamRuntime
from harness import eventually

HOME = [push_runtime("home-1")]
QUIET_S = 60  # jobs.quiet_s: the lease of a call
DISPATCHER_LEASE_S = 600


async def test_the_reaper_asks_the_runtime_before_anything_and_extends_a_running_call(
    dsn: str,
) -> None:
    async with rig(dsn, runtimes=HOME) as r:
        home = r.scripted("home-1")
        await r.submit("j1")
        await r.dispatcher.tick()
        r.clock.advance(QUIET_S + 1)
        report = await r.reaper.tick()
        job = await r.job("j1")
    assert (1, 1) == (report.expired, report.extended)
    assert ["home-1-call-1"] == home.asked
    assert ("home-1:home-1-call-1", 0) == (job.leased_by, job.rescue_count)
    assert (
        r.clock.now().timestamp() + QUIET_S == (job.lease_expires_at or r.clock.now()).timestamp()
    )
    assert ["j1"] == home.submits


async def test_a_call_the_runtime_reports_completed_completes_the_job_without_a_second_run(
    dsn: str,
) -> None:
    async with rig(dsn, runtimes=HOME) as r:
        home = r.scripted("home-1")
        await r.submit("j1")
        await r.dispatcher.tick()
        home.statuses["home-1-call-1"] = CallStatus("completed", result={"ok": 1}, cost_cents=2.5)
        r.clock.advance(QUIET_S + 1)
        report = await r.reaper.tick()
        job = await r.job("j1")
    assert 1 == report.completed
    assert ("completed", {"ok": 1}, 2.5) == (job.state, job.result, job.cost_cents)
    assert ["j1"] == home.submits


async def test_a_call_the_runtime_does_not_know_is_rescued_and_dispatched_again(
    dsn: str,
) -> None:
    async with rig(dsn, runtimes=HOME) as r:
        home = r.scripted("home-1")
        await r.submit("j1")
        await r.dispatcher.tick()
        home.forget()  # the worker restarted
        r.clock.advance(QUIET_S + 1)
        report = await r.reaper.tick()
        rescued = await r.job("j1")
        await r.dispatcher.drain()
        again = await r.job("j1")
        trail = await r.trail("j1")
    assert 1 == report.rescued
    assert ["home-1-call-1"] == home.asked
    assert ("queued", 1) == (rescued.state, rescued.rescue_count)
    assert ("home-1:home-1-call-2", 2) == (again.leased_by, again.submit_count)
    assert ("rescued", "home-1", None) in trail


async def test_a_call_the_runtime_reports_failed_is_recorded_and_the_job_walks_on(
    dsn: str,
) -> None:
    runtimes = [push_runtime("home-1"), push_runtime("home-2")]
    async with rig(dsn, runtimes=runtimes, chain=["home-1", "home-2"]) as r:
        await r.submit("j1")
        await r.dispatcher.tick()
        r.scripted("home-1").statuses["home-1-call-1"] = CallStatus(
            "failed", error_code="WORKER_OOM", message="out of memory"
        )
        r.clock.advance(QUIET_S + 1)
        report = await r.reaper.tick()
        await r.dispatcher.drain()
        job = await r.job("j1")
        trail = await r.trail("j1")
    assert 1 == report.released
    assert ("home-2", {"home-1": 2, "home-2": 1}) == (job.runner, job.attempts)
    assert ("failed", "home-1", "WORKER_OOM") in trail


async def test_a_call_that_failed_through_the_jobs_own_fault_fails_the_job(dsn: str) -> None:
    async with rig(dsn, runtimes=HOME) as r:
        await r.submit("j1")
        await r.dispatcher.tick()
        r.scripted("home-1").statuses["home-1-call-1"] = CallStatus(
            "failed", error_code="UPSTREAM_400", message="bad prompt", terminal=True
        )
        r.clock.advance(QUIET_S + 1)
        await r.reaper.tick()
        job = await r.job("j1")
    assert ("failed", "UPSTREAM_400", "bad prompt") == (
        job.state,
        job.error_code,
        job.error_message,
    )


async def test_the_lease_of_a_dispatcher_that_died_is_taken_back(dsn: str) -> None:
    async with rig(dsn, runtimes=HOME) as r:
        await r.submit("j1")
        (claimed,) = await r.store.claim_jobs(limit=10, lease_s=DISPATCHER_LEASE_S)
        r.clock.advance(QUIET_S + 1)
        early = await r.reaper.tick()
        r.clock.advance(DISPATCHER_LEASE_S)
        report = await r.reaper.tick()
        job = await r.job("j1")
    assert f"j1-dispatcher@{r.store.replica}" == claimed.leased_by
    assert 0 == early.expired
    assert 1 == report.rescued
    assert ("queued", 1) == (job.state, job.rescue_count)
    assert [] == r.scripted("home-1").asked


async def test_past_max_rescues_the_job_fails_lease_lost(dsn: str) -> None:
    async with rig(dsn, runtimes=HOME, jobs={"max_rescues": 1}) as r:
        await r.submit("j1")
        reports = []
        for _ in range(2):
            await r.store.claim_jobs(limit=10, lease_s=DISPATCHER_LEASE_S)
            r.clock.advance(DISPATCHER_LEASE_S + 1)
            reports.append(await r.reaper.tick())
        job = await r.job("j1")
    assert [(1, 0), (0, 1)] == [(rep.rescued, rep.lost) for rep in reports]
    assert ("failed", "LEASE_LOST", 1) == (job.state, job.error_code, job.rescue_count)


async def test_a_call_quiet_for_stuck_after_reaps_counts_once_as_stuck(dsn: str) -> None:
    async with rig(dsn, runtimes=HOME, stuck_after=2) as r:
        await r.submit("j1")
        await r.dispatcher.tick()
        stuck = []
        for _ in range(4):
            r.clock.advance(QUIET_S + 1)
            stuck.append((await r.reaper.tick()).stuck)
        job = await r.job("j1")
    assert [0, 1, 0, 0] == stuck
    assert {"home-1": 1} == r.reaper.stuck_by_runtime
    assert "home-1:home-1-call-1" == job.leased_by


async def test_after_a_restart_an_upstream_call_is_unknown_and_its_job_runs_again(
    dsn: str,
) -> None:
    async with rig(dsn) as r:
        r.servers["q0"].update(hang=True)
        await r.submit("j1")
        await r.dispatcher.tick()
        await eventually(lambda: r.servers["q0"].stats.open_requests == 1, what="call started")
        await r.local.close()  # the process died with its call
        restarted = UpstreamRuntime(
            "local", r.gateway.proxy, r.store, r.clock, on_finished=r.dispatcher.slot_freed
        )
        r.runtimes["local"] = restarted
        r.servers["q0"].update(hang=False)
        r.clock.advance(QUIET_S + 1)
        report = await r.reaper.tick()
        await r.dispatcher.drain()
        await r.idle()
        job = await r.job("j1")
    assert 1 == report.rescued
    assert ("completed", 1, 2) == (job.state, job.rescue_count, job.submit_count)


async def test_at_start_up_a_lone_process_takes_back_every_lease_at_once(dsn: str) -> None:
    async with rig(dsn, runtimes=HOME) as r:
        await r.submit("j1")
        await r.store.claim_jobs(limit=10, lease_s=DISPATCHER_LEASE_S)
        report = await r.reaper.recover()
        job = await r.job("j1")
    assert 1 == report.rescued
    assert "queued" == job.state


async def test_the_reaper_sums_up_what_it_did(dsn: str) -> None:
    async with rig(dsn, runtimes=HOME) as r:
        await r.submit("j1")
        await r.dispatcher.tick()
        r.scripted("home-1").forget()
        r.clock.advance(QUIET_S + 1)
        await r.reaper.tick()
    assert "<Reaper expired=1 completed=0 extended=0 rescued=1 lost=0 stuck=0>" == repr(r.reaper)


async def test_at_start_up_recovery_takes_back_more_leases_than_one_page(dsn: str) -> None:
    async with rig(dsn, runtimes=HOME) as r:
        for i in range(7):
            await r.submit(f"j{i}")
        await r.store.claim_jobs(limit=10, lease_s=DISPATCHER_LEASE_S)
        paged = Reaper(r.store, r.runtimes, r.gateway.config, r.clock, limit=3)
        report = await paged.recover()
        states = {(await r.job(f"j{i}")).state for i in range(7)}
    assert 7 == report.rescued
    assert {"queued"} == states


async def test_a_running_upstream_call_keeps_its_lease_alive_so_no_other_reaper_reruns_it(
    dsn: str,
) -> None:
    """Another replica's runtime cannot answer for this call ("unknown"), so only the
    heartbeat of the process running it keeps its job from being rescued and run twice."""
    async with rig(dsn) as r:
        r.servers["q0"].update(hang=True)
        await r.submit("j1")
        await r.dispatcher.tick()
        await eventually(lambda: r.servers["q0"].stats.open_requests == 1, what="call started")
        other_replica = Reaper(
            r.store,
            {"local": UpstreamRuntime("local", r.gateway.proxy, r.store, r.clock)},
            r.gateway.config,
            r.clock,
        )
        reports = []
        for _ in range(6):  # 6 x 25 s: well past the 60 s lease without a heartbeat
            before = (await r.job("j1")).lease_expires_at
            r.clock.advance(25)
            async with asyncio.timeout(5):
                while (await r.job("j1")).lease_expires_at == before:
                    await asyncio.sleep(0.01)
            reports.append(await other_replica.tick())
        await r.local.close()  # now the process dies: no more heartbeats
        r.clock.advance(61)
        after_death = await other_replica.tick()
        job = await r.job("j1")
    assert [0] * 6 == [report.expired for report in reports]
    assert 1 == after_death.rescued
    assert ("queued", 1) == (job.state, job.rescue_count)
    assert {"j1": 1} == r.received()
