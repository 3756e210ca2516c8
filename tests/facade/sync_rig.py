"""A gateway with one fake model server on GPU 0 of a fake exporter, GPU polls by hand."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
from multidict import CIMultiDict

from gpugate.clock import ManualClock
from gpugate.fleet import FakeExporter, ModelServer
from harness import RunningGateway, make_config, serving, upstream

POLL_S = 15.0
CHAT_ROUTE = "/v1/chat/completions"


@dataclass
class SyncRig:
    gw: RunningGateway
    http: aiohttp.ClientSession
    exporter: FakeExporter
    server: ModelServer
    clock: ManualClock

    async def saturate(self) -> None:
        """GPU 0 at 99 % for a full ring of polls: batch on ``m1`` is shed from now on."""
        self.exporter.set_gpu(0, util=99)
        monitor = self.gw.gateway.monitor
        assert monitor is not None
        for _ in range(2):
            self.clock.advance(POLL_S)
            await monitor.tick()

    @property
    def upstream_calls(self) -> int:
        return self.server.stats.requests[CHAT_ROUTE]

    @property
    def shed(self) -> int:
        gate = self.gw.gateway.proxy.gate
        assert gate is not None
        return gate.shed

    async def submit(
        self,
        input_: dict[str, Any],
        *,
        wait: str = "30",
        cls: str = "batch",
        headers: dict[str, str] | None = None,
    ) -> tuple[int, CIMultiDict[str], dict[str, Any]]:
        body = {"model": "m1", "input": input_, "class": cls}
        url = f"{self.gw.v1}/jobs?wait={wait}"
        async with self.http.post(url, json=body, headers=headers or {}) as resp:
            return resp.status, resp.headers.copy(), await resp.json()

    async def jobs(self) -> int:
        page = await self.gw.gateway.store.list_jobs(state=None, runner=None, limit=500)
        return len(page.jobs)


@contextlib.asynccontextmanager
async def sync_rig(
    sqlite_dsn: str, *, cache: dict[str, Any] | None = None
) -> AsyncIterator[SyncRig]:
    async with contextlib.AsyncExitStack() as stack:
        exporter = await stack.enter_async_context(FakeExporter(1))
        server = await stack.enter_async_context(ModelServer(["m1"], name="s1"))
        extra = {} if cache is None else {"cache": cache}
        config = make_config(
            sqlite_dsn,
            [upstream("u1", [server.url], ["m1"], gpu_ids=[0], **extra)],
            gpu_health={
                "dcgm_url": exporter.metrics_url,
                "poll_s": 3600,
                "sustained_samples": 2,
                "shed_batch": True,
            },
        )
        clock = ManualClock()
        gw = await stack.enter_async_context(serving(config, clock=clock))
        http = await stack.enter_async_context(aiohttp.ClientSession())
        yield SyncRig(gw, http, exporter, server, clock)
