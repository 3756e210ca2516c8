"""The engine monitor scrapes real fake engines over loopback; bad scrapes are counted and keep
the last reading until it goes stale, then routing gets nothing (fail open)."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpugate.adapters.upstream_client import UpstreamClient
from gpugate.clock import ManualClock
from gpugate.config import EngineConfig, RoutingConfig, UpstreamConfig
from gpugate.core.picking import EndpointState
from gpugate.core.scoring import Router
from gpugate.errors import ScrapeError
from gpugate.fleet import EngineSpec, ModelServer
from gpugate.metrics import Metrics
from gpugate.services.engine_monitor import EngineMonitor

MODEL = "m"
FAST_IDLE = EngineSpec(prefill_s_per_token=0.0, decode_s_per_token=0.0)


def upstream(url: str, **engine: Any) -> UpstreamConfig:
    return UpstreamConfig(
        id="u", url=url, models=[MODEL], engine=EngineConfig(poll_s=2, staleness_s=10, **engine)
    )


@pytest.fixture
async def client() -> AsyncIterator[UpstreamClient]:
    c = UpstreamClient()
    await c.start()
    yield c
    await c.close()


@pytest.fixture
async def busy_engine() -> AsyncIterator[ModelServer]:
    spec = EngineSpec(max_seqs=1, prefill_s_per_token=0.0, decode_s_per_token=3600.0)
    async with ModelServer([MODEL], name="busy", engine=spec) as server:
        yield server


def scrapes(metrics: Metrics, outcome: str) -> float:
    text = metrics.render().decode()
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "gateway_engine_scrapes_total" and s.labels["outcome"] == outcome
    )


@contextlib.asynccontextmanager
async def three_held(server: ModelServer) -> AsyncIterator[None]:
    """Three requests held on ``server``'s one slot (1 running, 2 waiting) for the block."""
    body = {"model": MODEL, "prompt": "hold", "max_tokens": 2, "stream": True}

    async def hold(http: aiohttp.ClientSession) -> None:
        async with http.post(f"{server.url}/v1/completions", json=body) as response:
            await response.read()

    engine = server.engine
    assert engine is not None
    async with aiohttp.ClientSession() as http:
        held = [asyncio.create_task(hold(http)) for _ in range(3)]
        try:
            for _ in range(500):  # bounded: the three requests reach the engine
                if engine.running + engine.waiting == 3:
                    break
                await asyncio.sleep(0.01)
            yield
        finally:
            for task in held:
                task.cancel()
            await asyncio.gather(*held, return_exceptions=True)


async def test_a_scrape_of_a_real_engine_gives_its_running_and_waiting_requests(
    busy_engine: ModelServer, client: UpstreamClient
) -> None:
    async with three_held(busy_engine):
        clock = ManualClock()
        monitor = EngineMonitor(
            [upstream(busy_engine.url)],
            client,
            clock,
            Metrics(),
            outstanding=lambda _upstream, _url: 3,
        )

        assert 1 == await monitor.tick()

    signal = monitor.signal("u", busy_engine.url, clock.monotonic())
    assert signal is not None
    assert ("vllm", 1.0, 2.0, 3) == (
        signal.reading.kind,
        signal.reading.running,
        signal.reading.waiting,
        signal.outstanding_then,
    )


async def test_a_failed_scrape_keeps_the_last_reading_until_it_is_stale() -> None:
    bodies: list[bytes | Exception] = [
        b'vllm:num_requests_running{engine="0"} 2\nvllm:num_requests_waiting{engine="0"} 5\n',
        ScrapeError("http://e/metrics answered 503"),
        b"<html>not metrics</html>",
    ]

    async def fetch(url: str, timeout_s: float) -> bytes:
        body = bodies.pop(0)
        if isinstance(body, Exception):
            raise body
        return body

    clock, metrics = ManualClock(), Metrics()
    url = "http://127.0.0.1:9"
    monitor = EngineMonitor([upstream(url)], UpstreamClient(), clock, metrics, fetch=fetch)
    assert 1 == await monitor.tick()
    for _ in range(2):
        clock.advance(2)
        assert 0 == await monitor.tick()

    kept = monitor.signal("u", url, clock.monotonic())
    clock.advance(10 - 4 + 0.001)
    stale = monitor.signal("u", url, clock.monotonic())

    assert kept is not None
    assert 5.0 == kept.reading.waiting
    assert stale is None
    assert (1.0, 2.0) == (scrapes(metrics, "ok"), scrapes(metrics, "error"))


async def test_an_endpoint_is_scraped_once_per_poll_not_on_every_tick() -> None:
    calls: list[str] = []

    async def fetch(url: str, timeout_s: float) -> bytes:
        calls.append(url)
        return b"te_queue_size 1\nte_batch_current_size 2\n"

    clock = ManualClock()
    monitor = EngineMonitor(
        [upstream("http://127.0.0.1:9", metrics_path="/prom")],
        UpstreamClient(),
        clock,
        Metrics(),
        fetch=fetch,
    )
    await monitor.tick()
    await monitor.tick()
    clock.advance(2)
    await monitor.tick()

    assert ["http://127.0.0.1:9/prom"] * 2 == calls


def test_upstreams_without_engine_or_with_kind_none_are_not_scraped() -> None:
    plain = UpstreamConfig(id="a", url="http://127.0.0.1:1", models=[MODEL])
    off = upstream("http://127.0.0.1:2", kind="none")

    monitor = EngineMonitor([plain, off], UpstreamClient(), ManualClock(), Metrics())

    assert (False, {}) == (monitor.active, monitor.endpoints)


async def test_a_dead_endpoint_is_a_counted_failure_and_never_raises(
    client: UpstreamClient,
) -> None:
    metrics = Metrics()
    dead = upstream("http://127.0.0.1:9", scrape_timeout_s=0.5)
    monitor = EngineMonitor([dead], client, ManualClock(), metrics)

    assert 0 == await monitor.tick()
    assert 1.0 == scrapes(metrics, "error")
    assert "failing=1" in repr(monitor)


def test_staleness_must_be_longer_than_the_poll() -> None:
    with pytest.raises(ValueError, match="staleness_s must be longer than poll_s"):
        EngineConfig(poll_s=5, staleness_s=5)


async def test_the_router_avoids_a_busy_engine_then_falls_back_to_outstanding_counts_when_stale(
    busy_engine: ModelServer, client: UpstreamClient
) -> None:
    """The busy engine's queue comes from its scrape; once that reading is older than
    staleness_s, load is gpugate's own count (0 there): it competes again — fail open."""
    async with ModelServer([MODEL], name="idle", engine=FAST_IDLE) as idle:
        async with three_held(busy_engine):
            clock = ManualClock()
            config = UpstreamConfig(
                id="u",
                urls=[busy_engine.url, idle.url],
                models=[MODEL],
                engine=EngineConfig(poll_s=2, staleness_s=10),
            )
            monitor = EngineMonitor([config], client, clock, Metrics())
            assert 2 == await monitor.tick()

        cfg = RoutingConfig(policy="engine_load")
        router = Router(lambda _m, _u: cfg, signal=monitor.signal)
        busy, quiet = EndpointState("u", busy_engine.url), EndpointState("u", idle.url)
        quiet.outstanding = 2  # gpugate's own: the idle engine has two of ours
        route = router.route(MODEL, None, {"prompt": "p"})
        fresh, _ = router.pick(route, [busy, quiet], random.Random(1), clock.monotonic())
        clock.advance(10.5)  # no scrape since: the reading is stale
        stale, _ = router.pick(route, [busy, quiet], random.Random(1), clock.monotonic())

    assert quiet is fresh  # 3 requests of others + 2 waiting on the busy one, against 2
    assert busy is stale  # outstanding 0 against 2


async def test_the_engine_gauges_name_an_endpoint_by_its_index_never_its_url(
    busy_engine: ModelServer, client: UpstreamClient
) -> None:
    metrics = Metrics()
    monitor = EngineMonitor(
        [upstream(busy_engine.url)], client, ManualClock(), metrics, outstanding=lambda _u, _e: 0
    )
    assert 1 == await monitor.tick()
    text = metrics.render().decode()
    samples = [
        s
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "gateway_engine_load"
    ]
    assert samples  # running, waiting, ... were exported
    assert {"0"} == {s.labels["endpoint"] for s in samples}
    assert busy_engine.url.split("//")[1] not in text  # no host:port on the open /metrics
