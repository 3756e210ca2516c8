"""``gpugate serve --workers N`` as a real subprocess: restarts, the drain, one process for 1."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import pytest

from gpugate.fleet import ModelServer, ServerBehaviour
from harness import eventually, make_config, upstream
from workers.processes import children, established_on, serve_process, stop, write_config

pytestmark = pytest.mark.e2e

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


async def _ready(url: str) -> int:
    async with aiohttp.ClientSession() as http, http.get(url + "/readyz") as response:
        return response.status


async def test_a_killed_worker_is_restarted_counted_and_the_address_keeps_serving(
    sqlite_dsn: str,
) -> None:
    async with ModelServer(["m"], name="up") as up:
        config = make_config(sqlite_dsn, [upstream("up", [up.url], ["m"])])
        async with serve_process(config, workers=2) as (url, proc, log):
            first = children(proc.pid)
            assert 2 == len(first)
            os.kill(first[0], signal.SIGKILL)
            await eventually(
                lambda: len(set(children(proc.pid)) - set(first)) == 1,
                within_s=15,
                what="a new worker in place of the killed one",
            )
            await eventually(lambda: "all 2 workers" in log.read_text(), what="serving")
            text = log.read_text()
            assert f"worker 0 (pid {first[0]}) exited (killed by SIGKILL)" in text
            assert "restarting it in 0.5 s (restart 1)" in text

            async def restarts() -> str:
                async with aiohttp.ClientSession() as http:
                    async with http.get(url + "/metrics") as response:
                        return await response.text()

            deadline = time.monotonic() + 15
            while "gateway_workers_reporting 2.0" not in (body := await restarts()):
                assert time.monotonic() < deadline, body[-2000:]
                await asyncio.sleep(0.05)
            assert "gateway_worker_restarts_total 1.0" in body
            for _ in range(10):  # fresh connections: each lands on either worker
                async with aiohttp.ClientSession() as http:
                    async with http.post(url + "/v1/chat/completions", json=CHAT) as response:
                        assert 200 == response.status


async def test_sigterm_drains_every_worker_and_the_supervisor_exits_0_after_them(
    sqlite_dsn: str,
) -> None:
    behaviour = ServerBehaviour(delay_s=2.0)
    async with ModelServer(["m"], name="slow", behaviour=behaviour) as slow:
        config = make_config(
            sqlite_dsn,
            [upstream("slow", [slow.url], ["m"])],
            server={"shutdown_grace_s": 10, "drain_delay_s": 0},
        )
        async with serve_process(config, workers=2) as (url, proc, _log):
            workers = children(proc.pid)
            port = int(url.rsplit(":", 1)[1])
            sessions = [aiohttp.ClientSession() for _ in range(16)]
            try:
                requests = [
                    asyncio.ensure_future(s.post(url + "/v1/chat/completions", json=CHAT))
                    for s in sessions
                ]
                await eventually(
                    lambda: slow.stats.open_requests == 16, within_s=10, what="16 in flight"
                )
                held = [established_on(pid, port) for pid in workers]
                assert all(count > 0 for count in held), f"connections per worker: {held}"
                proc.send_signal(signal.SIGTERM)
                responses = await asyncio.wait_for(asyncio.gather(*requests), timeout=20)
                assert [200] * 16 == [r.status for r in responses]
            finally:
                for session in sessions:
                    await session.close()
            assert 0 == await stop(proc)
            assert [] == [pid for pid in workers if Path(f"/proc/{pid}").exists()]


async def test_readyz_answers_503_on_every_worker_while_they_drain(sqlite_dsn: str) -> None:
    async with ModelServer(["m"], name="up") as up:
        config = make_config(
            sqlite_dsn,
            [upstream("up", [up.url], ["m"])],
            server={"shutdown_grace_s": 5, "drain_delay_s": 4},
        )
        async with serve_process(config, workers=2) as (url, proc, _log):
            assert {200} == {await _ready(url) for _ in range(12)}
            proc.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + 3
            while await _ready(url) != 503:  # the supervisor forwards it to both at once
                assert time.monotonic() < deadline, "no worker began to drain"
            statuses = {await _ready(url) for _ in range(12)}  # fresh connections: both workers
            assert {503} == statuses


@pytest.mark.parametrize("workers", [1, None], ids=["workers-1", "the-default"])
async def test_workers_1_and_the_default_are_one_process_without_a_supervisor(
    sqlite_dsn: str, workers: int | None
) -> None:
    async with ModelServer(["m"], name="up") as up:
        config = make_config(sqlite_dsn, [upstream("up", [up.url], ["m"])])
        async with serve_process(config, workers=workers) as (url, proc, log):
            assert [] == children(proc.pid)
            assert 200 == await _ready(url)
            async with aiohttp.ClientSession() as http, http.get(url + "/metrics") as response:
                assert "gateway_workers" not in await response.text()
            assert "workers" not in log.read_text().split("listening on", 1)[1].splitlines()[0]


async def test_sigterm_while_the_workers_are_still_starting_exits_0(sqlite_dsn: str) -> None:
    config = make_config(sqlite_dsn, [upstream("up", ["http://127.0.0.1:9"], ["m"])])
    directory = Path(tempfile.mkdtemp(prefix="gpugate-serve-test-"))
    path = write_config(config, directory)
    command = [sys.executable, "-m", "gpugate", "serve", "--config", str(path)]
    command += ["--listen", "127.0.0.1:0", "--workers", "2"]
    log = directory / "serve.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    try:
        await eventually(lambda: "listening on" in log.read_text(), within_s=20, what="bound")
        proc.send_signal(signal.SIGTERM)  # before, while or after the workers start
        assert 0 == await stop(proc), log.read_text()[-2000:]
    finally:
        await stop(proc)
        shutil.rmtree(directory, ignore_errors=True)
