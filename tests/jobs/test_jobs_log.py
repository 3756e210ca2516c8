"""One INFO line per job transition on ``gpugate.jobs`` (issue #19), written once it committed."""

from __future__ import annotations

import asyncio
import logging

import aiohttp
import pytest

from harness import make_config, model_servers, serving, upstream

CHAT = {"messages": [{"role": "user", "content": "hi"}]}


async def test_a_jobs_transitions_are_logged_once_committed(
    sqlite_dsn: str, http: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    async with model_servers(("q0", ["qwen"])) as (server,):
        config = make_config(sqlite_dsn, [upstream("q0", [server.url], ["qwen"])])
        async with serving(config) as gw:
            with caplog.at_level(logging.INFO, logger="gpugate.jobs"):
                body = {"model": "qwen", "input": CHAT, "slug": "logged-1"}
                async with http.post(gw.v1 + "/jobs", json=body) as resp:
                    assert 202 == resp.status
                async with asyncio.timeout(15):
                    while (job := await gw.gateway.store.get_job("logged-1")) is None or (
                        job.state != "completed"
                    ):
                        await asyncio.sleep(0.02)
    lines = [r.getMessage() for r in caplog.records if r.name == "gpugate.jobs"]
    mine = [line for line in lines if line.startswith("job logged-1 ")]
    assert any(line.startswith("job logged-1 submitted on local") for line in mine), lines
    assert any(line.startswith("job logged-1 completed") for line in mine), lines
    assert len(mine) == len(set(mine))  # each transition once
