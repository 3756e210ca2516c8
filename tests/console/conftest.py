"""A gateway with a fake exporter behind it, and an operator's browser-like session to it."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest
from console_rig import ENV, Console

from gpugate.fleet import FakeExporter
from harness import make_config, model_servers, serving, upstream


@pytest.fixture
async def console(sqlite_dsn: str) -> AsyncIterator[Console]:
    """Two upstreams on GPUs 0 and 1 of a fake exporter; the monitor polls only when told."""
    async with (
        FakeExporter(gpus=2) as exporter,
        model_servers(("a", ["m"]), ("b", ["m"])) as (
            a,
            b,
        ),
    ):
        config = make_config(
            sqlite_dsn,
            [
                upstream("a", [a.url], ["m"], gpu_ids=[0]),
                upstream("b", [b.url], ["m"], gpu_ids=[1]),
            ],
            gpu_health={"dcgm_url": exporter.metrics_url, "poll_s": 3600},
        )
        async with serving(config, environ=ENV) as gw:
            jar = aiohttp.CookieJar(unsafe=True)  # the gateway is an IP address, 127.0.0.1
            async with aiohttp.ClientSession(cookie_jar=jar) as http:
                yield Console(http, gw, exporter)
