"""Each stop condition disables and drains its runtime: the reason is in the runtime's detail and
the audit log, a metric counts it, and the jobs that were in flight on it walk on and complete."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import pytest
from guard_rig import ENV, FakeWorker, admin_get, create_job, guard_config, metric

from harness import eventually, model_servers, serving

if TYPE_CHECKING:
    import aiohttp

    from harness import RunningGateway


async def states(gw: RunningGateway, slugs: list[str]) -> dict[str, str]:
    found = {}
    for slug in slugs:
        job = await gw.gateway.store.get_job(slug)
        assert job is not None
        found[slug] = job.state
    return found


async def until_states(gw: RunningGateway, wanted: dict[str, str], what: str) -> None:
    """Wait (bounded, polling the store) until each job is in its wanted state."""
    seen: dict[str, str] = {}
    try:
        async with asyncio.timeout(15):
            while (seen := await states(gw, list(wanted))) != wanted:
                await asyncio.sleep(0.02)
    except TimeoutError:
        pytest.fail(f"{what} did not hold within 15 s: {seen}")


async def stopped(http: aiohttp.ClientSession, gw: RunningGateway, condition: str) -> Any:
    """The runtime's detail, after checking the stop is recorded everywhere it should be."""
    detail = await admin_get(http, gw.url, "/admin/runtimes/home-1")
    health = detail["health"]
    assert ("disabled", f"gateway:{condition}") == (health["state"], health["actor"])
    assert [f"gateway:{condition}"] == [e["actor"] for e in health["auto_disables"]]
    audit = await admin_get(http, gw.url, "/admin/audit?subject=runtime:home-1")
    disables = [e for e in audit["data"] if e["action"] == "runtime.disabled"]
    assert [f"gateway:{condition}"] == [e["actor"] for e in disables]
    assert health["reason"] == disables[0]["detail"]["reason"]
    assert 1 == await metric(http, gw.url, "gateway_runtime_auto_disabled_total", reason=condition)
    return detail


async def test_a_401_on_submit_disables_and_drains_the_runtime_and_its_jobs_complete_elsewhere(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    async with (
        model_servers(("q0", ["qwen"])) as (model,),
        FakeWorker(accept=2).serving() as worker,
    ):
        config = guard_config(sqlite_dsn, model.url, worker.url)
        async with serving(config, environ=ENV) as gw:
            await create_job(http, gw.url, "held-1")
            await create_job(http, gw.url, "held-2")
            await eventually(lambda: len(worker.calls) == 2, what="two calls held on home-1")

            await create_job(http, gw.url, "refused")

            slugs = ["held-1", "held-2", "refused"]
            await until_states(gw, dict.fromkeys(slugs, "completed"), "all completed")
            detail = await stopped(http, gw, "auth_error")
            jobs = {s: await gw.gateway.store.get_job(s) for s in slugs}
    assert "401" in detail["health"]["reason"]
    assert sorted(worker.calls) == sorted(worker.cancelled)
    assert dict.fromkeys(slugs, "local") == {s: j.runner for s, j in jobs.items() if j}
    assert 1 == worker.refused


async def test_more_stuck_calls_than_max_stuck_disable_and_drain_the_runtime(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    async with (
        model_servers(("q0", ["qwen"])) as (model,),
        FakeWorker().serving() as worker,
    ):
        config = guard_config(
            sqlite_dsn, model.url, worker.url, stop={"max_stuck": 1}, jobs={"quiet_s": 0.05}
        )
        async with serving(config, environ=ENV) as gw:
            slugs = ["stuck-1", "stuck-2"]
            for slug in slugs:
                await create_job(http, gw.url, slug)
            await until_states(gw, dict.fromkeys(slugs, "completed"), "both completed")
            detail = await stopped(http, gw, "max_stuck")
    assert "stuck calls (max_stuck 1)" in detail["health"]["reason"]
    assert sorted(worker.calls) == sorted(worker.cancelled)


async def test_a_job_submitted_max_submits_times_stops_its_runtime_and_fails_submit_limit(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    """``lost``'s call is unknown to the worker, so the reaper takes it back; its next dispatch
    would be its second submit. ``held`` was in flight on the same runtime and walks on."""
    async with (
        model_servers(("q0", ["qwen"])) as (model,),
        FakeWorker().serving() as worker,
    ):
        config = guard_config(
            sqlite_dsn,
            model.url,
            worker.url,
            stop={"max_submits_per_job": 1},
            jobs={"quiet_s": 0.3},
        )
        async with serving(config, environ=ENV) as gw:
            await create_job(http, gw.url, "held")
            await eventually(lambda: len(worker.calls) == 1, what="held on home-1")
            await create_job(http, gw.url, "lost")
            await eventually(lambda: len(worker.calls) == 2, what="lost on home-1")
            worker.states[worker.call_of("lost")] = "unknown"

            wanted = {"held": "completed", "lost": "failed"}
            await until_states(gw, wanted, "held completed, lost failed")
            detail = await stopped(http, gw, "max_submits")
            lost = await gw.gateway.store.get_job("lost")
    assert lost is not None
    assert "SUBMIT_LIMIT" == lost.error_code
    assert "job lost was submitted 1 times" in detail["health"]["reason"]
    assert [worker.call_of("held")] == worker.cancelled
