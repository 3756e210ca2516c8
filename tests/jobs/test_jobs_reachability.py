"""An unreachable runtime is skipped (DESIGN §5.2), as ``GET /admin/runtimes/{id}`` shows it.

A real gateway (its wiring's runtime views, its prober) whose ``local`` runtime's model has no
upstream in rotation: the prober found its only endpoint down. Before, the walk never heard of
it (the views were built without reachability), so the job was submitted to ``local`` only for
the call to fail ``NO_HEALTHY_UPSTREAM`` and walk on; now the walk skips it, saying why.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp

from gpugate.fleet import ModelServer
from gpugate.store import JobRecord, NewJob
from harness import RunningGateway, make_config, serving, upstream
from ports import free_port
from push.fake_worker import FakeWorker

TOKEN = "reach-admin-token"
ENV = {"GPUGATE_ADMIN_TOKEN": TOKEN, "HOME1_SECRET": "secret-of-home-1"}
CHAT = {"messages": [{"role": "user", "content": "hello"}]}


@asynccontextmanager
async def gateway(
    dsn: str, worker: FakeWorker, *, bge: str | None = None
) -> AsyncIterator[RunningGateway]:
    """``local`` (upstream; ``qwen`` on a port nobody listens on, ``bge`` on ``bge`` if given)
    first in the chain, then ``home-1`` (push, bearer, ``worker``); the job loops held still."""
    ups = [upstream("q-dead", [f"http://127.0.0.1:{free_port()}"], ["qwen"])]
    if bge is not None:
        ups.append(upstream("b0", [bge], ["bge"]))
    home = {
        "id": "home-1",
        "kind": "push",
        "models": ["qwen"],
        "push": {"url": worker.url, "secret_env": "HOME1_SECRET", "auth": "bearer"},
    }
    config = make_config(
        dsn,
        ups,
        admin_token_env="GPUGATE_ADMIN_TOKEN",
        runtimes=[{"id": "local", "kind": "upstream"}, home],
        fallback_chain=["local", "home-1"],
        default_runtime="local",
    )
    async with serving(config, environ=ENV, run_job_loops=False) as gw:
        for _ in range(2):  # down after two failed probes
            await gw.gateway.prober.tick()
        yield gw


async def reachable(http: aiohttp.ClientSession, gw: RunningGateway) -> bool | None:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with http.get(gw.url + "/admin/runtimes/local", headers=headers) as resp:
        assert 200 == resp.status, await resp.text()
        found: bool | None = (await resp.json())["health"]["reachable"]
        return found


async def test_a_runtime_shown_unreachable_is_skipped_without_a_submit(
    dsn: str, http: aiohttp.ClientSession
) -> None:
    async with FakeWorker() as worker, gateway(dsn, worker) as gw:
        shown = await reachable(http, gw)
        store = gw.gateway.store
        await store_job(gw, "j1")
        await gw.gateway.dispatcher.drain()
        job = await store.get_job("j1")
        events = await store.job_events("j1")
    assert shown is False
    assert job is not None
    assert ("home-1", "dispatching") == (job.runner, job.state)  # held by the worker's call
    assert [] == [e for e in events if e.runtime == "local" and e.status in ("submitted", "failed")]
    (walked,) = [e for e in events if e.status == "walked"]
    assert {"from": "local", "why": "unreachable"} == walked.detail
    assert ["POST"] == [r.method for r in worker.received]


async def test_a_model_without_an_endpoint_is_unreachable_while_the_runtimes_others_run(
    dsn: str, http: aiohttp.ClientSession
) -> None:
    """``local`` serves qwen (down) and bge (up): it is reachable, as its detail says, and a
    bge job runs there; a qwen job skips it for the runtime that can reach its model."""
    async with (
        FakeWorker() as worker,
        ModelServer(["bge"], name="b0") as bge,
        gateway(dsn, worker, bge=bge.url) as gw,
    ):
        shown = await reachable(http, gw)
        await store_job(gw, "q1")
        await store_job(gw, "b1", model="bge", job_input={"input": "hi"}, operation="embeddings")
        await gw.gateway.dispatcher.drain()
        q1 = await gw.gateway.store.get_job("q1")
        walked = [e for e in await gw.gateway.store.job_events("q1") if e.status == "walked"]
        b1 = await until_finished(gw, "b1")
    assert shown is True
    assert q1 is not None
    assert "home-1" == q1.runner
    assert ["unreachable"] == [e.detail["why"] for e in walked]
    assert ("completed", "local") == (b1.state, b1.runner)


async def store_job(
    gw: RunningGateway,
    slug: str,
    *,
    model: str = "qwen",
    job_input: dict[str, Any] | None = None,
    operation: str = "chat/completions",
) -> None:
    new = NewJob(
        slug=slug, model=model, input=job_input or CHAT, operation=operation, runner="local"
    )
    await gw.gateway.store.create_job(new)


async def until_finished(gw: RunningGateway, slug: str) -> JobRecord:
    async with asyncio.timeout(10):
        while (job := await gw.gateway.store.get_job(slug)) is None or not job.terminal:
            await asyncio.sleep(0.01)
    return job
