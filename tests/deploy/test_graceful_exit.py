"""A gateway leaving on purpose hands its work over (issue #20): a drain stops it claiming jobs,
and on the way out the dispatcher claims it still holds go back to the queue at once."""

from __future__ import annotations

import asyncio

from gpugate.clock import ManualClock
from gpugate.store import NewJob
from gpugate.store.factory import open_store
from gpugate.wiring import CLAIMING_LOOPS, build_gateway
from harness import eventually, make_config, upstream

UPSTREAM = [upstream("a", ["http://127.0.0.1:9"], ["m"])]


async def test_the_dispatcher_claims_a_gateway_holds_are_back_in_the_queue_once_it_has_exited(
    sqlite_dsn: str,
) -> None:
    clock = ManualClock()
    config = make_config(sqlite_dsn, UPSTREAM)
    async with build_gateway(config, environ={}, clock=clock, run_job_loops=False) as gateway:
        for slug in ("a", "b"):
            await gateway.store.create_job(NewJob(model="m", input={}, runner="local", slug=slug))
        held = await gateway.store.claim_jobs(limit=2, lease_s=600)  # as its dispatcher would

    store = open_store(sqlite_dsn, clock=clock)
    await store.open()
    try:
        after = [await store.get_job(job.slug) for job in held]
        statuses = [(await store.job_events(job.slug))[-1].status for job in held]
    finally:
        await store.close()
    assert [("queued", None)] * 2 == [(j.state, j.leased_by) for j in after if j is not None]
    assert ["released"] * 2 == statuses


async def test_a_draining_gateway_stops_the_loops_that_claim_work_and_keeps_the_others(
    sqlite_dsn: str,
) -> None:
    config = make_config(sqlite_dsn, UPSTREAM)
    async with build_gateway(config, environ={}) as gateway:
        before = _loops()
        gateway.lifecycle.drain()
        stopped = {*CLAIMING_LOOPS, "stop-loops"}  # the stopper task itself ends last
        await eventually(lambda: not _loops() & stopped, what="claiming stopped")
        after = _loops()

    assert set(CLAIMING_LOOPS) <= before
    assert before - set(CLAIMING_LOOPS) == after  # the reaper, heartbeat, ... go on


def _loops() -> set[str]:
    """The names of the gateway's loops running now."""
    return {
        t.get_name().removeprefix("gpugate.")
        for t in asyncio.all_tasks()
        if t.get_name().startswith("gpugate.") and not t.done()
    }
