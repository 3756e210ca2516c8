"""Budgets through a whole gateway: each call reserves its estimate, the soft cap alerts once,
over budget the runtime is skipped, and an operator's drain sends calls in flight elsewhere."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from guard_rig import ENV, TOKEN, FakeWorker, admin_get, create_job, guard_config, metric

from harness import eventually, model_servers, serving

if TYPE_CHECKING:
    import aiohttp

    from harness import RunningGateway

# daily_cents 1, estimate 1 cent: the first call reaches the soft cap, the second 2x (over).
ONE_CENT_A_CALL = {"daily_cents": 1, "cents_per_second": 0.1, "estimate_s": 10}


async def until_state(gw: RunningGateway, slug: str, state: str) -> None:
    async with asyncio.timeout(15):
        while (job := await gw.gateway.store.get_job(slug)) is None or job.state != state:
            await asyncio.sleep(0.02)


async def test_reservations_raise_the_soft_cap_once_then_skip_the_runtime_over_budget(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    async with (
        model_servers(("q0", ["qwen"])) as (model,),
        FakeWorker().serving() as worker,
    ):
        config = guard_config(sqlite_dsn, model.url, worker.url, budget=ONE_CENT_A_CALL)
        async with serving(config, environ=ENV) as gw:
            for count, slug in enumerate(("first", "second"), start=1):
                await create_job(http, gw.url, slug)
                await eventually(lambda n=count: n == len(worker.calls), what=f"{slug} held")
            await create_job(http, gw.url, "third")
            await until_state(gw, "third", "completed")
            await gw.gateway.guardrails.tick()
            spend = (await admin_get(http, gw.url, "/admin/runtimes/home-1"))["spend"]
            audit = await admin_get(http, gw.url, "/admin/audit?action=runtime.soft_cap")
            soft = await metric(http, gw.url, "gateway_runtime_soft_cap", runtime="home-1")
            over = await metric(http, gw.url, "gateway_runtime_over_budget", runtime="home-1")
            third = await gw.gateway.store.get_job("third")
    assert 2 == len(worker.calls)
    assert third is not None
    assert "local" == third.runner
    assert (2.0, True, True) == (spend["today_cents"], spend["soft_cap"], spend["over_budget"])
    assert [("reserved", 1.0)] * 2 == [(e["state"], e["cents"]) for e in spend["ledger"]]
    assert 14 == len(spend["days"])
    assert 2.0 == spend["days"][-1]["cents"]
    assert ["runtime:home-1"] == [e["subject"] for e in audit["data"]]
    assert (1.0, 1.0) == (soft, over)


async def test_a_call_is_admitted_while_todays_spend_is_below_twice_daily_cents(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    """The audit's budget: daily_cents 1 (over budget at 2), each call reserving 1.2 cents
    (0.02 x the default 60 s estimate). After the first call today's spend is 1.2, below 2 and
    not over budget, so the second runs on home-1 too (its estimate carries the day to 2.4);
    only the third, at 2.4, is skipped. Before, the second was refused (1.2 + 1.2 > 2) while
    the runtime's detail said over_budget false."""
    async with (
        model_servers(("q0", ["qwen"])) as (model,),
        FakeWorker().serving() as worker,
    ):
        budget = {"daily_cents": 1, "cents_per_second": 0.02}
        config = guard_config(sqlite_dsn, model.url, worker.url, budget=budget)
        async with serving(config, environ=ENV) as gw:
            await create_job(http, gw.url, "first")
            await eventually(lambda: 1 == len(worker.calls), what="first held")
            await gw.gateway.guardrails.tick()
            after_one = (await admin_get(http, gw.url, "/admin/runtimes/home-1"))["spend"]
            await create_job(http, gw.url, "second")
            await eventually(lambda: 2 == len(worker.calls), what="second held")
            await create_job(http, gw.url, "third")
            await until_state(gw, "third", "completed")
            await gw.gateway.guardrails.tick()
            after_three = (await admin_get(http, gw.url, "/admin/runtimes/home-1"))["spend"]
            third = await gw.gateway.store.get_job("third")
    assert (1.2, False) == (after_one["today_cents"], after_one["over_budget"])
    assert ["first", "second"] == sorted(worker.calls.values())
    assert third is not None
    assert "local" == third.runner
    assert (2.4, True) == (round(after_three["today_cents"], 6), after_three["over_budget"])


async def test_an_operator_drain_cancels_the_calls_in_flight_and_their_jobs_walk_on(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    async with (
        model_servers(("q0", ["qwen"])) as (model,),
        FakeWorker().serving() as worker,
    ):
        config = guard_config(sqlite_dsn, model.url, worker.url)
        async with serving(config, environ=ENV) as gw:
            await create_job(http, gw.url, "held")
            await eventually(lambda: len(worker.calls) == 1, what="held on home-1")

            headers = {"Authorization": f"Bearer {TOKEN}"}
            body = {"reason": "maintenance"}
            async with http.post(
                gw.url + "/admin/runtimes/home-1/drain", json=body, headers=headers
            ) as resp:
                assert 200 == resp.status, await resp.text()
            await until_state(gw, "held", "completed")
            events = await gw.gateway.store.job_events("held")
    assert [worker.call_of("held")] == worker.cancelled
    drained = [e for e in events if e.error_code == "RUNTIME_DRAINED"]
    assert ["failed", "released"] == [e.status for e in drained]
    assert "local" == events[-1].runtime
