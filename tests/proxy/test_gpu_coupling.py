"""GPU health coupled to routing, end to end: the fake exporter, the real openai client.

Polls are driven by hand (``monitor.tick()``) on a manual clock, so "within two polls" and
"after staleness_s" are exact, not slept for.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import openai
import pytest

from gpugate.clock import ManualClock
from gpugate.fleet import FakeExporter, ModelServer
from gpugate.services.gpu_monitor import GpuMonitor
from harness import RunningGateway, eventually, make_config, serving, upstream

TOKEN = "admin-token"
CHAT = [{"role": "user", "content": "hi"}]
POLL_S = 15.0
STALENESS_S = 60.0


@dataclass
class Rig:
    gw: RunningGateway
    exporter: FakeExporter
    servers: dict[str, ModelServer]
    clock: ManualClock

    @property
    def monitor(self) -> GpuMonitor:
        assert self.gw.gateway.monitor is not None
        return self.gw.gateway.monitor

    async def poll(self, times: int = 1) -> None:
        for _ in range(times):
            self.clock.advance(POLL_S)
            await self.monitor.tick()

    def hits(self, name: str, route: str = "/v1/chat/completions") -> int:
        return self.servers[name].stats.requests[route]


@contextlib.asynccontextmanager
async def rig(
    sqlite_dsn: str, placement: dict[str, tuple[str, int]], **gpu_health: Any
) -> AsyncIterator[Rig]:
    """Fake servers named by ``placement`` (name -> (model, GPU index)) behind a gateway whose
    gpu_health reads one fake exporter with two GPUs."""
    async with contextlib.AsyncExitStack() as stack:
        exporter = await stack.enter_async_context(FakeExporter(2))
        servers = {
            name: await stack.enter_async_context(ModelServer([model], name=name))
            for name, (model, _) in placement.items()
        }
        ups = [
            upstream(name, [servers[name].url], [model], gpu_ids=[gpu])
            for name, (model, gpu) in placement.items()
        ]
        health = {
            "dcgm_url": exporter.metrics_url,
            "poll_s": 3600,  # the loop polls once at start; the tests poll by hand
            "staleness_s": STALENESS_S,
            "sustained_samples": 2,
            **gpu_health,
        }
        config = make_config(sqlite_dsn, ups, gpu_health=health)
        clock = ManualClock()
        environ = {"GPUGATE_ADMIN_TOKEN": TOKEN}
        gw = await stack.enter_async_context(serving(config, environ=environ, clock=clock))
        monitor = gw.gateway.monitor
        assert monitor is not None
        # the loop's start-up poll is done — answered, not only sent (a scrape is counted when
        # it starts) — before the test changes the exporter's answers
        await eventually(
            lambda: all(e.last_success is not None or e.failures for e in monitor.exporters),
            what="the start-up poll",
        )
        yield Rig(gw, exporter, servers, clock)


async def chat(
    gw: RunningGateway, model: str, *, cls: str | None = None
) -> tuple[int, Mapping[str, str], Any]:
    headers = {"X-Request-Class": cls} if cls else {}
    body = {"model": model, "messages": CHAT}
    async with (
        aiohttp.ClientSession() as http,
        http.post(gw.v1 + "/chat/completions", json=body, headers=headers) as resp,
    ):
        return resp.status, resp.headers.copy(), await resp.json()


async def test_a_fatal_xid_takes_the_gpus_upstream_out_within_two_polls_and_clear_brings_it_back(
    sqlite_dsn: str,
) -> None:
    placement = {"q0": ("qwen", 0), "q1": ("qwen", 1)}
    async with rig(sqlite_dsn, placement) as r:
        r.exporter.set_gpu(1, xid=79)
        await r.poll(2)
        client = openai.AsyncOpenAI(base_url=r.gw.v1, api_key="unused", max_retries=0)
        before = r.hits("q1")
        for _ in range(20):
            await client.chat.completions.create(model="qwen", messages=CHAT)
        assert before == r.hits("q1"), "the faulted GPU's upstream got new requests"
        assert 20 == r.hits("q0")
        async with (
            aiohttp.ClientSession() as http,
            http.post(
                r.gw.url + "/admin/gpus/1/clear", headers={"Authorization": f"Bearer {TOKEN}"}
            ) as resp,
        ):
            cleared = await resp.json()
        assert 200 == resp.status
        assert cleared["cleared"]
        for _ in range(20):
            await client.chat.completions.create(model="qwen", messages=CHAT)
        await client.close()
        assert r.hits("q1") > before, "traffic did not return after the clear"
        audit = await r.gw.gateway.store.list_audit(action="gpu.cleared")
        assert ["gpu:1"] == [event.subject for event in audit]


async def test_a_faulted_gpu_1_takes_all_four_of_its_upstreams_out_while_gpu_0_keeps_serving(
    sqlite_dsn: str,
) -> None:
    placement = {
        "qwen-35b": ("qwen-35b", 0),
        "cleanup-3b": ("cleanup-3b", 1),
        "tei-embeddings": ("bge-m3", 1),
        "gpu-server": ("gpu-server", 1),
        "doc-classifier": ("doc-classifier", 1),
    }
    async with rig(sqlite_dsn, placement) as r:
        r.exporter.set_gpu(1, xid=79)
        await r.poll(2)
        status, headers, _ = await chat(r.gw, "qwen-35b")
        assert (200, "qwen-35b") == (status, headers["X-Gateway-Upstream"])
        for model in ("cleanup-3b", "bge-m3", "gpu-server", "doc-classifier"):
            status, headers, body = await chat(r.gw, model)
            assert (503, "NO_HEALTHY_UPSTREAM") == (status, body["error"]["code"]), model
            assert "GPU 1 faulted" in body["error"]["message"]
            assert "XID 79" in body["error"]["message"]
            assert "Retry-After" in headers


async def test_only_batch_is_shed_when_every_candidate_is_saturated_each_shed_counted_once(
    sqlite_dsn: str,
) -> None:
    async with rig(sqlite_dsn, {"q0": ("qwen", 0), "q1": ("qwen", 1)}, shed_batch=True) as r:
        for gpu in (0, 1):
            r.exporter.set_gpu(gpu, util=97)
        await r.poll(2)
        statuses = []
        for _ in range(3):
            status, headers, body = await chat(r.gw, "qwen", cls="batch")
            statuses.append((status, body["error"]["code"]))
            assert int(headers["Retry-After"]) >= 1
        interactive, _, _ = await chat(r.gw, "qwen", cls="interactive")
        system, _, _ = await chat(r.gw, "qwen", cls="system")
        r.exporter.set_gpu(1, util=20)  # one candidate recovers: batch goes there
        await r.poll(1)
        recovered, headers, _ = await chat(r.gw, "qwen", cls="batch")
        async with aiohttp.ClientSession() as http, http.get(r.gw.url + "/metrics") as resp:
            metrics = await resp.text()
    assert [(429, "GPU_SATURATED")] * 3 == statuses
    assert (200, 200) == (interactive, system)
    assert (200, "q1") == (recovered, headers["X-Gateway-Upstream"])
    assert 'gateway_gpu_shed_total{site="proxy"} 3.0' in metrics


async def test_a_saturated_gpu_needs_a_full_ring_of_samples_at_or_above_the_threshold(
    sqlite_dsn: str,
) -> None:
    async with rig(sqlite_dsn, {"q0": ("qwen", 0)}, shed_batch=True, sustained_samples=3) as r:
        r.exporter.set_gpu(0, util=95)
        await r.poll(1)  # with the start-up poll: 2 of 3 samples (the first was 0 %)
        first, _, _ = await chat(r.gw, "qwen", cls="batch")
        await r.poll(2)  # ring full of 95s
        second, _, _ = await chat(r.gw, "qwen", cls="batch")
    assert (200, 429) == (first, second)


async def test_an_idempotent_replay_of_batch_is_served_while_the_gpus_are_saturated(
    sqlite_dsn: str,
) -> None:
    async with rig(sqlite_dsn, {"q0": ("qwen", 0)}, shed_batch=True) as r:
        headers = {"X-Request-Class": "batch", "Idempotency-Key": "k1"}
        body = {"model": "qwen", "messages": CHAT}
        async with aiohttp.ClientSession() as http:
            async with http.post(r.gw.v1 + "/chat/completions", json=body, headers=headers) as a:
                assert 200 == a.status
            r.exporter.set_gpu(0, util=99)
            await r.poll(2)
            async with http.post(r.gw.v1 + "/chat/completions", json=body, headers=headers) as b:
                replayed = (b.status, b.headers.get("Idempotent-Replayed"))
        gate = r.gw.gateway.proxy.gate
        assert gate is not None
        assert (200, "true") == replayed
        assert 0 == gate.shed


@pytest.mark.parametrize("mode", ["down", "hang"])
async def test_when_the_exporter_goes_down_or_hangs_saturation_fails_open_a_held_fault_holds(
    sqlite_dsn: str, mode: str
) -> None:
    """Issue 14 defect 12b: stale data fails open — nothing is shed — but a fault inside its
    hold is old evidence, not no evidence: its upstream stays out of rotation until the hold
    (``fault_hold_s`` after its last evidence) runs out. On main it came back at staleness."""
    placement = {"q0": ("qwen", 0), "q1": ("qwen", 1)}
    hold = {"fault_hold_s": 300, "scrape_timeout_s": 0.2}
    async with rig(sqlite_dsn, placement, shed_batch=True, **hold) as r:
        r.exporter.set_gpu(1, xid=79)
        r.exporter.set_gpu(0, util=99)
        await r.poll(2)
        assert r.monitor.guard("q1") is not None
        r.exporter.set_mode(mode)
        await r.poll(1)
        assert r.monitor.guard("q1") is not None, "one failed scrape is no verdict"
        r.clock.advance(STALENESS_S)
        await r.poll(1)
        stale_guard = r.monitor.guard("q1")
        saturated = r.monitor.saturated("q0")
        batch, _, _ = await chat(r.gw, "qwen", cls="batch")
        served_by_q1 = r.hits("q1")
        r.clock.advance(300)  # past the hold, still no data: no evidence any more
        await r.poll(1)
        after_hold = r.monitor.guard("q1")
        (exporter,) = r.monitor.exporters
        failures = exporter.failures
        r.exporter.set_mode("normal")  # let a hung scrape go
    assert stale_guard is not None
    assert "XID 79" in stale_guard
    assert not saturated
    assert (200, 0) == (batch, served_by_q1)  # q0 took it: not shed, not sent to the faulted GPU
    assert after_hold is None
    assert failures >= 3


async def test_an_exporter_serving_garbage_is_a_counted_error_and_serving_goes_on(
    sqlite_dsn: str,
) -> None:
    async with rig(sqlite_dsn, {"q0": ("qwen", 0)}) as r:
        (exporter,) = r.monitor.exporters
        failures, success = exporter.failures, exporter.last_success
        for mode in ("garbage", "truncated"):
            r.exporter.set_mode(mode)
            await r.poll(1)
            status, _, _ = await chat(r.gw, "qwen")
            assert 200 == status, mode
        # Each poll of the bad text failed and was counted (the loop's own start-up scrape may
        # also have read it); none was taken for data: the last good scrape is the one before.
        assert exporter.failures - failures >= 2
        assert success == exporter.last_success
        assert "SCRAPE_FAILED" in (exporter.last_error or "")


async def test_admin_gpus_shows_each_gpu_its_upstreams_and_why_it_is_faulted(
    sqlite_dsn: str,
) -> None:
    async with rig(sqlite_dsn, {"q0": ("qwen", 0), "q1": ("qwen", 1)}) as r:
        r.exporter.set_gpu(1, xid=79, temp=71)
        await r.poll(2)
        auth = {"Authorization": f"Bearer {TOKEN}"}
        async with (
            aiohttp.ClientSession() as http,
            http.get(r.gw.url + "/admin/gpus", headers=auth) as resp,
        ):
            body = await resp.json()
    by_gpu = {entry["gpu"]: entry for entry in body["gpus"]}
    assert ["q1"] == by_gpu[1]["upstreams"]
    assert "faulted" == by_gpu[1]["verdict"]
    assert "XID 79" in by_gpu[1]["fault_reason"]
    assert by_gpu[1]["faulted_since"]
    assert (71, 79) == (by_gpu[1]["temp_c"], by_gpu[1]["last_xid"])
    assert ("ok", False, False) == (
        by_gpu[0]["verdict"],
        by_gpu[0]["stale"],
        by_gpu[0]["saturated"],
    )
    assert 0 == body["exporters"][0]["failures"]


@pytest.mark.parametrize("block", [None, {"dcgm_url": ""}], ids=["no-block", "empty-url"])
async def test_a_dormant_config_behaves_exactly_as_no_gpu_health_block(
    sqlite_dsn: str, block: dict[str, Any] | None
) -> None:
    async with ModelServer(["qwen"], name="q0") as server:
        extra = {} if block is None else {"gpu_health": block}
        config = make_config(
            sqlite_dsn, [upstream("q0", [server.url], ["qwen"], gpu_ids=[0])], **extra
        )
        async with serving(config) as gw:
            gateway = gw.gateway
            assert (None, None, None) == (
                gateway.monitor,
                gateway.registry.guard,
                gateway.proxy.gate,
            )
            status, _, _ = await chat(gw, "qwen", cls="batch")
            async with aiohttp.ClientSession() as http, http.get(gw.url + "/metrics") as resp:
                metrics = await resp.text()
    assert 200 == status
    assert "gateway_gpu_shed_total{" not in metrics
    assert "gateway_gpu_util_percent{" not in metrics
