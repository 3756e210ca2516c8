"""The reference push worker against a real gateway and the simulated fleet's model server:
it runs what it is pushed, reports claimed → result, refuses what it has no slot or secret for,
and keeps a finished result on disk until the gateway has taken it — across a gateway restart
and across its own."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
from push_rig import (
    CHAT,
    SECRETS,
    gateway_headers,
    held_gateway,
    leased,
    push_call,
    push_config,
    running_worker,
    until_state,
)

from gpugate.fleet import ModelServer
from gpugate.worker import WorkerSettings
from gpugate.worker.calls import FinalReport
from gpugate.worker.outbox import Outbox
from gpugate.worker.server import serve_worker
from harness import eventually, serving
from ports import free_port


async def test_a_job_pushed_by_the_gateway_runs_on_the_model_server_and_completes(
    sqlite_dsn: str, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    port = free_port()
    worker_url = f"http://127.0.0.1:{port}/calls"
    async with ModelServer(["qwen"], name="q0") as fake:
        config = push_config(sqlite_dsn, fake.url, urls=(worker_url, worker_url))
        async with (
            serving(config, environ=SECRETS) as gw,
            running_worker(port, gw.url, fake.url, tmp_path / "outbox") as worker,
        ):
            body = {"model": "qwen", "input": CHAT, "slug": "j1"}
            async with http.post(gw.url + "/v1/jobs", json=body) as resp:
                assert 202 == resp.status
            job = await until_state(gw.gateway.store, "j1", "completed")
            events = await gw.gateway.store.job_events("j1")
            await eventually(lambda: worker.completed == 1, what="the worker saw it taken")

    assert "chat.completion" == job.result["object"]
    assert job.cost_cents is not None
    assert job.cost_cents > 0  # duration x cents_per_second
    assert {"j1": 1} == fake.stats.executions
    trail = [(e.status, e.actor) for e in events]
    assert ("running", "worker:home-1") in trail
    assert ("completed", "worker:home-1") == trail[-1]
    assert [] == list((tmp_path / "outbox").glob("*.json"))


async def test_the_worker_refuses_a_call_beyond_its_concurrency_with_429(
    sqlite_dsn: str, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    port = free_port()
    async with ModelServer(["qwen"], name="q0") as fake:
        fake.update(hang=True)
        async with (
            held_gateway(sqlite_dsn, fake.url) as gw,
            running_worker(port, gw.url, fake.url, tmp_path / "o", concurrency=1) as worker,
        ):
            first = await leased(gw.gateway.store, "j1")
            second = await leased(gw.gateway.store, "j2")
            url = f"http://127.0.0.1:{port}/calls"

            accepted = await push_call(http, url, "j1", first.lease_token)
            again = await push_call(http, url, "j1", first.lease_token)  # a retried submit
            busy = await push_call(http, url, "j2", second.lease_token)
            await until_state(gw.gateway.store, "j1", "running")
            fake.update(hang=False)
            await until_state(gw.gateway.store, "j1", "completed")
            await eventually(lambda: worker.completed == 1, what="the worker saw it taken")

    assert 202 == accepted[0]
    assert (202, accepted[1]["call_id"]) == (again[0], again[1]["call_id"])
    assert (429, "WORKER_BUSY") == (busy[0], busy[1]["error"]["code"])


async def test_the_worker_refuses_a_push_without_the_runtimes_secret(
    sqlite_dsn: str, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    port = free_port()
    async with (
        ModelServer(["qwen"], name="q0") as fake,
        running_worker(port, "http://127.0.0.1:9", fake.url, tmp_path / "o") as worker,
    ):
        url = f"http://127.0.0.1:{port}/calls"
        status, body = await push_call(http, url, "j1", "tok", secret="not-it")

    assert (401, "UNAUTHORIZED") == (status, body["error"]["code"])
    assert 0 == worker.active


async def test_a_result_finished_while_the_gateway_is_down_is_kept_on_disk_and_reaches_it_after(
    dsn: str, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    """The gateway goes away while the model works; the worker keeps the result on disk and
    retries; the restarted gateway gets it once (on SQLite its start-up recovery asks the
    worker first; on PostgreSQL the worker's retried PATCH lands)."""
    gateway_port, port = free_port(), free_port()
    outbox = tmp_path / "outbox"
    async with ModelServer(["qwen"], name="q0") as fake:
        config = push_config(dsn, fake.url, urls=(f"http://127.0.0.1:{port}/calls",) * 2)
        gateway_url = f"http://127.0.0.1:{gateway_port}"
        async with running_worker(port, gateway_url, fake.url, outbox):
            async with serving(config, environ=SECRETS, run_job_loops=False,
                               port=gateway_port) as gw:  # fmt: skip
                store = gw.gateway.store
                job = await leased(store, "j1", recorded=False)
                assert job.lease_token is not None
                fake.update(hang=True)
                url = f"http://127.0.0.1:{port}/calls"
                status, body = await push_call(http, url, "j1", job.lease_token)
                assert 202 == status
                assert await store.record_submit(
                    "j1", job.lease_token, runtime="home-1", call_id=body["call_id"],
                    lease_s=60, running=False,
                )  # fmt: skip
                await until_state(gw.gateway.store, "j1", "running")
            fake.update(hang=False)  # the gateway is gone: the answer comes now
            await eventually(lambda: len(list(outbox.glob("*.json"))) == 1, what="kept on disk")
            async with serving(config, environ=SECRETS, run_job_loops=False,
                               port=gateway_port) as gw:  # fmt: skip
                done = await until_state(gw.gateway.store, "j1", "completed")
                await eventually(lambda: not list(outbox.glob("*.json")), what="outbox emptied")
                completions = [e for e in await gw.gateway.store.job_events("j1")
                               if e.status == "completed"]  # fmt: skip

    assert "chat.completion" == done.result["object"]
    assert 1 == len(completions)
    assert {"j1": 1} == fake.stats.executions


async def test_a_report_left_on_disk_by_a_previous_run_is_sent_when_the_worker_starts(
    sqlite_dsn: str, tmp_path: Path
) -> None:
    outbox = tmp_path / "outbox"
    async with (
        ModelServer(["qwen"], name="q0") as fake,
        held_gateway(sqlite_dsn, fake.url) as gw,
    ):
        job = await leased(gw.gateway.store, "j1")
        assert job.lease_token is not None
        left = Outbox(outbox)
        left.open()
        left.keep(FinalReport("c1", "j1", job.lease_token, "result", {"result": {"n": 1}}))

        async with running_worker(free_port(), gw.url, fake.url, outbox) as worker:
            done = await until_state(gw.gateway.store, "j1", "completed")
            await eventually(lambda: worker.completed == 1, what="the report was taken")
            events = await gw.gateway.store.job_events("j1")

    assert {"n": 1} == done.result
    assert "worker:home-1" == events[-1].actor
    assert [] == list(outbox.glob("*.json"))
    assert {} == fake.stats.executions  # nothing ran again


async def test_the_status_route_answers_a_running_call_and_delete_cancels_it(
    sqlite_dsn: str, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    port = free_port()
    async with ModelServer(["qwen"], name="q0") as fake:
        fake.update(hang=True)
        async with (
            held_gateway(sqlite_dsn, fake.url) as gw,
            running_worker(port, gw.url, fake.url, tmp_path / "o") as worker,
        ):
            job = await leased(gw.gateway.store, "j1")
            url = f"http://127.0.0.1:{port}/calls"
            _, accepted = await push_call(http, url, "j1", job.lease_token)
            call_url = f"{url}/{accepted['call_id']}"
            await until_state(gw.gateway.store, "j1", "running")
            await eventually(lambda: fake.stats.open_requests == 1, what="the model works")
            async with http.get(call_url, headers=gateway_headers("GET", call_url)) as resp:
                running = (resp.status, (await resp.json())["state"])
            async with http.delete(call_url, headers=gateway_headers("DELETE", call_url)) as resp:
                cancelled = resp.status
            async with http.get(call_url, headers=gateway_headers("GET", call_url)) as resp:
                after = (resp.status, (await resp.json())["state"])
            await eventually(lambda: fake.stats.open_requests == 0, what="the request closed")

    assert (200, "running") == running
    assert 204 == cancelled
    assert (404, "unknown") == after
    assert 0 == worker.active


async def test_the_worker_exits_after_idle_exit_s_with_nothing_to_run_or_send(
    tmp_path: Path,
) -> None:
    settings = WorkerSettings(
        runtime_id="home-1",
        secret="s",
        gateway_url="http://127.0.0.1:9",
        upstream_url="http://127.0.0.1:9",
        state_dir=tmp_path / "o",
        idle_exit_s=0.2,
    )

    async with asyncio.timeout(10):
        code = await serve_worker(settings, "127.0.0.1", free_port())

    assert 0 == code
