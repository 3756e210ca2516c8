"""A job's dispatch is a trace of its own: the walk, and a span per runtime call (issue #19)."""

from __future__ import annotations

import asyncio

import aiohttp

from harness import make_config, model_servers, serving, upstream
from otlp_receiver import otlp_receiver

CHAT = {"messages": [{"role": "user", "content": "hello jobs"}]}


async def test_a_dispatched_job_has_a_dispatch_span_with_one_child_per_runtime_call(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    async with otlp_receiver() as collector, model_servers(("q0", ["qwen"])) as (server,):
        config = make_config(
            sqlite_dsn,
            [upstream("q0", [server.url], ["qwen"])],
            telemetry={"otlp_endpoint": collector.url},
        )
        async with serving(config) as gw:
            async with http.post(gw.url + "/v1/jobs", json={"model": "qwen", "input": CHAT}) as r:
                slug = (await r.json())["slug"]
            async with asyncio.timeout(10):
                while True:
                    async with http.get(f"{gw.url}/v1/jobs/{slug}") as r:
                        if (await r.json())["state"] == "completed":
                            break
                    await asyncio.sleep(0.02)
    (dispatch,) = collector.named("dispatch job")
    assert ("internal", "", False) == (dispatch.kind, dispatch.parent_id, dispatch.failed)
    assert {
        "gpugate.job": slug,
        "gen_ai.request.model": "qwen",
        "gpugate.dispatch.outcome": "dispatched",
        "gpugate.runtime": "local",
    }.items() <= dispatch.attributes.items()
    assert [("submit local", "client", False)] == [
        (s.name, s.kind, s.failed) for s in collector.children(dispatch)
    ]
