"""Job results: small ones inline in the job, large ones (over ``blobs.inline_max_bytes``) in the
blob store with only their key on the job; ``GET /v1/jobs/{slug}/result`` serves either."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp

from gpugate.fleet import ServerBehaviour
from harness import make_config, model_servers, serving, upstream

CHAT = {"messages": [{"role": "user", "content": "hello results"}]}


async def run_job(http: aiohttp.ClientSession, url: str, slug: str) -> dict[str, Any]:
    body = {"model": "qwen", "input": CHAT, "slug": slug}
    async with http.post(url + "/v1/jobs", json=body) as resp:
        assert 202 == resp.status
    async with asyncio.timeout(10):
        while True:
            async with http.get(f"{url}/v1/jobs/{slug}") as resp:
                job: dict[str, Any] = await resp.json()
            if job["state"] == "completed":
                return job
            await asyncio.sleep(0.02)


async def fetch(http: aiohttp.ClientSession, url: str) -> tuple[int, Any]:
    async with http.get(url) as resp:
        return resp.status, await resp.json()


async def test_a_large_result_is_kept_in_the_blob_store_and_served_whole(
    dsn: str, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    blobs = tmp_path / "blobs"
    async with model_servers(("q0", ["qwen"])) as (server,):
        config = make_config(
            dsn,
            [upstream("q0", [server.url], ["qwen"])],
            blobs={"dir": str(blobs), "inline_max_bytes": 64},
        )
        async with serving(config) as gw:
            job = await run_job(http, gw.url, "big")
            status, result = await fetch(http, f"{gw.url}/v1/jobs/big/result")
    assert (None, 200) == (job["result"], status)
    assert job["result_ref"].startswith("results/big/")
    assert "q0 answers: hello results" == result["choices"][0]["message"]["content"]
    stored = blobs.joinpath(*job["result_ref"].split("/"))
    assert result == json.loads(stored.read_bytes())


async def test_a_small_result_stays_inline_and_the_result_route_serves_it_too(
    dsn: str, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    blobs = tmp_path / "blobs"
    async with model_servers(("q0", ["qwen"])) as (server,):
        config = make_config(
            dsn, [upstream("q0", [server.url], ["qwen"])], blobs={"dir": str(blobs)}
        )
        async with serving(config) as gw:
            job = await run_job(http, gw.url, "small")
            status, result = await fetch(http, f"{gw.url}/v1/jobs/small/result")
    assert (None, 200) == (job["result_ref"], status)
    assert job["result"] == result
    assert not blobs.exists()


async def test_a_result_is_refused_before_the_job_completes_and_for_an_unknown_job(
    dsn: str, http: aiohttp.ClientSession
) -> None:
    async with model_servers(("q0", ["qwen"]), behaviour=ServerBehaviour(hang=True)) as (server,):
        config = make_config(dsn, [upstream("q0", [server.url], ["qwen"])])
        async with serving(config) as gw:
            body = {"model": "qwen", "input": CHAT, "slug": "slow"}
            async with http.post(gw.url + "/v1/jobs", json=body) as resp:
                assert 202 == resp.status
            pending = await fetch(http, f"{gw.url}/v1/jobs/slow/result")
            unknown = await fetch(http, f"{gw.url}/v1/jobs/nope/result")
    assert (409, "JOB_NOT_COMPLETED") == (pending[0], pending[1]["error"]["code"])
    assert (404, "JOB_NOT_FOUND") == (unknown[0], unknown[1]["error"]["code"])
