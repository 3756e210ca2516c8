"""`gpugate jobs submit|list|show|cancel` against a running gateway."""

from __future__ import annotations

import asyncio
import json

import pytest

from gpugate.cli import main
from harness import eventually, make_config, model_servers, serving, upstream


async def test_the_jobs_commands_submit_follow_and_cancel(
    sqlite_dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    async with model_servers(("q0", ["qwen"])) as (server,):
        async with serving(make_config(sqlite_dsn, [upstream("q0", [server.url], ["qwen"])])) as gw:
            gateway = ["--gateway", gw.url]
            chat = json.dumps({"messages": [{"role": "user", "content": "hi"}]})

            async def run(*argv: str) -> tuple[int, str, str]:
                code = await asyncio.to_thread(main, list(argv))
                captured = capsys.readouterr()
                return code, captured.out, captured.err

            code, submitted, err = await run(
                "jobs", "submit", *gateway, "--model", "qwen", "--input", chat,
                "--slug", "cli-1", "--idempotency-key", "k-cli",
            )  # fmt: skip
            assert (0, "created job cli-1") == (code, err.strip())
            assert "cli-1" == json.loads(submitted)["slug"]
            again = await run(
                "jobs", "submit", *gateway, "--model", "qwen", "--input", chat,
                "--idempotency-key", "k-cli",
            )  # fmt: skip
            assert "existing job cli-1" == again[2].strip()
            await eventually(
                lambda: server.stats.executions.get("cli-1") == 1, within_s=15, what="ran"
            )
            store = gw.gateway.store

            async def done() -> bool:
                job = await store.get_job("cli-1")
                return job is not None and job.state == "completed"

            async with asyncio.timeout(10):
                while not await done():
                    await asyncio.sleep(0.02)
            code, listed, _ = await run("jobs", "list", *gateway)
            cancel = await run("jobs", "cancel", *gateway, "cli-1")
            code, shown, _ = await run("jobs", "show", *gateway, "cli-1", "--events")
            code, _, err = await run("jobs", "show", *gateway, "nope")
    header, row = listed.splitlines()
    assert ["SLUG", "STATE", "RUNNER", "MODEL", "ERROR"] == header.split()
    assert ["cli-1", "completed", "local", "qwen"] == row.split()
    # cancelling a finished job changes nothing, and the command says so with exit 1
    assert (1, "job cli-1 is completed: nothing to cancel") == (cancel[0], cancel[2].strip())
    assert '"state": "completed"' in shown
    assert "submitted" in shown
    assert 1 == code
    assert "404 JOB_NOT_FOUND" in err
