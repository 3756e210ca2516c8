"""The job families on /metrics: the dispatcher's and the reaper's totals by outcome, and each
runtime's queue depth and calls in flight as the store counts them (every replica's work)."""

from __future__ import annotations

import asyncio

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from gpugate.fleet import ServerBehaviour
from harness import eventually, make_config, model_servers, serving, upstream

CHAT = {"messages": [{"role": "user", "content": "hello"}]}


async def samples(http: aiohttp.ClientSession, url: str) -> dict[tuple[str, str], float]:
    """Every sample of the job families, keyed by (name, its one label's value)."""
    async with http.get(url + "/metrics") as resp:
        text = await resp.text()
    found = {}
    for family in text_string_to_metric_families(text):
        if family.name.startswith(("gateway_jobs", "gateway_runtime")):
            for sample in family.samples:
                label = next(iter(sample.labels.values()), "")
                found[(sample.name, label)] = sample.value
    return found


async def test_the_job_families_count_dispatches_and_show_queue_and_in_flight_per_runtime(
    dsn: str, http: aiohttp.ClientSession
) -> None:
    held = ServerBehaviour(hang=True)
    async with model_servers(("q0", ["qwen"]), behaviour=held) as (server,):
        config = make_config(dsn, [upstream("q0", [server.url], ["qwen"], max_inflight=1)])
        async with serving(config) as gw:
            for i in range(3):
                body = {"model": "qwen", "input": CHAT, "slug": f"m{i}"}
                async with http.post(gw.url + "/v1/jobs", json=body) as resp:
                    assert 202 == resp.status
            await eventually(
                lambda: gw.gateway.dispatcher.totals.dispatched >= 3,
                within_s=10,
                what="three jobs dispatched",
            )
            await gw.gateway.gauges.tick()
            during = await samples(http, gw.url)
            server.update(hang=False)
            async with asyncio.timeout(10):
                while await gw.gateway.store.count_leased("local"):
                    await asyncio.sleep(0.01)
            await gw.gateway.gauges.tick()
            after = await samples(http, gw.url)
    assert 3 == during[("gateway_jobs_dispatch_total", "dispatched")]
    assert 0 == during[("gateway_jobs_dispatch_total", "failed")]
    assert 3 == during[("gateway_runtime_in_flight", "local")]
    assert 0 == during[("gateway_runtime_queue_depth", "local")]
    assert 0 == after[("gateway_runtime_in_flight", "local")]
    assert 0 == after[("gateway_jobs_reaped_total", "rescued")]
