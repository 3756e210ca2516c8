"""A job whose runner is a Modal runtime, through a whole gateway: created over HTTP, spawned in
the SDK fake, its result written through a presigned URL into S3 (moto), and completed by the
reaper's poll — the only completion path — with its cost on the job."""

from __future__ import annotations

import asyncio
import secrets
from types import ModuleType
from typing import Any

import aiohttp
from modal_rig import TOKEN

from gpugate.fleet import ModelServer
from harness import make_config, serving, upstream
from s3_server import ENVIRON, S3Server

CHAT = {"messages": [{"role": "user", "content": "hello modal"}]}


async def test_a_modal_job_completes_through_the_reapers_poll_with_its_result_and_cost(
    modal_sdk: ModuleType,
    reference_function: ModuleType,
    s3: S3Server,
    fleet: ModelServer,
    sqlite_dsn: str,
    http: aiohttp.ClientSession,
) -> None:
    bucket = f"g-{secrets.token_hex(4)}"
    s3.create_bucket(bucket)
    s3_block = s3.config(bucket).model_dump(exclude_none=True)
    modal_runtime = {
        "id": "modal-beta",
        "kind": "modal",
        "models": ["qwen"],
        "modal": {"app": "worker", "function": "generate", "environment": "beta"},
        "budget": {"daily_cents": 1000, "cents_per_second": 0.05},
    }
    config = make_config(
        sqlite_dsn,
        [upstream("q0", [fleet.url], ["qwen"])],
        runtimes=[{"id": "local", "kind": "upstream"}, modal_runtime],
        fallback_chain=["local", "modal-beta"],
        blobs={"kind": "s3", "s3": s3_block},
        jobs={"reap_s": 0.1},  # a call is polled every pass; quiet_s (60) plays no part
    )
    environ = {**ENVIRON, "MODAL_TOKEN_ID": TOKEN[0], "MODAL_TOKEN_SECRET": TOKEN[1]}
    async with serving(config, environ=environ) as gw:
        body = {"model": "qwen", "input": CHAT, "runner": "modal-beta", "slug": "mj1"}
        async with http.post(gw.url + "/v1/jobs", json=body) as resp:
            assert 202 == resp.status
        job = await finished(http, gw.url, "mj1")
        async with http.get(gw.url + "/v1/jobs/mj1/events") as resp:
            events = (await resp.json())["data"]
    (call,) = modal_sdk.CLOUD.calls.values()
    assert ("completed", "modal-beta") == (job["state"], job["runner"])
    assert "m0 answers: hello modal" == job["result"]["choices"][0]["message"]["content"]
    assert job["cost_cents"] > 0
    assert "mj1" == call.args[0]["slug"]
    submitted = next(e for e in events if e["status"] == "submitted")
    completed = events[-1]
    assert ("modal-beta", "completed", "reaper") == (
        submitted["runtime"], completed["status"], completed["actor"],
    )  # fmt: skip
    # a serverless call runs from its submit: that transition is the event after `submitted`
    running = events[events.index(submitted) + 1]
    assert ("running", "modal-beta", submitted["call_id"]) == (
        running["status"], running["runtime"], running["call_id"],
    )  # fmt: skip
    assert {"mj1": 1} == fleet.stats.executions


async def finished(http: aiohttp.ClientSession, url: str, slug: str) -> dict[str, Any]:
    async with asyncio.timeout(10):
        while True:
            async with http.get(f"{url}/v1/jobs/{slug}") as resp:
                job: dict[str, Any] = await resp.json()
            if job["state"] in {"completed", "failed", "cancelled"}:
                return job
            await asyncio.sleep(0.02)
