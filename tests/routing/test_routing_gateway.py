"""Routing that knows the engines, end to end: simulated engines on loopback behind a real
gateway, the real openai client. Which engine answered is its ``X-Fleet-Server`` header."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import openai

from gpugate.fleet import EngineSpec, FakeExporter, ModelServer
from harness import RunningGateway, eventually, make_config, serving, upstream

MODEL = "m"
FAST = EngineSpec(max_seqs=4, prefill_s_per_token=100e-6, decode_s_per_token=1e-3, max_tokens=4)
ENGINE = {"kind": "vllm", "poll_s": 0.1, "staleness_s": 2}
_words = itertools.count()


def prompt(n: int = 300) -> str:
    """A prompt no other request shares."""
    return " ".join(f"w{next(_words)}" for _ in range(n))


@contextlib.asynccontextmanager
async def fleet(
    sqlite_dsn: str, specs: list[EngineSpec], models: list[str] | None = None, **up: Any
) -> AsyncIterator[tuple[RunningGateway, list[ModelServer]]]:
    async with contextlib.AsyncExitStack() as stack:
        servers = [
            await stack.enter_async_context(
                ModelServer(models or [MODEL], name=f"e{i}", engine=spec)
            )
            for i, spec in enumerate(specs)
        ]
        entry = upstream("u", [s.url for s in servers], models or [MODEL], **up)
        config = make_config(sqlite_dsn, [entry])
        gw = await stack.enter_async_context(serving(config))
        yield gw, servers


async def served_by(
    client: openai.AsyncOpenAI, messages: list[dict[str, str]], **extra: Any
) -> str:
    raw = await client.chat.completions.with_raw_response.create(
        model=extra.pop("model", MODEL), messages=messages, **extra
    )
    return raw.headers["x-fleet-server"]


async def fresh_readings(gw: RunningGateway, n: int) -> None:
    monitor = gw.gateway.engine_monitor
    assert monitor is not None
    await eventually(
        lambda: sum(e.reading is not None for e in monitor.endpoints.values()) == n,
        what="a reading of every engine",
    )


async def test_a_4x_slower_engine_gets_under_15_percent_of_the_traffic_under_engine_load(
    sqlite_dsn: str,
) -> None:
    # service times of 0.3 s and 1.2 s: far above what a loaded machine adds to a request
    steady = EngineSpec(max_seqs=4, prefill_s_per_token=1e-3, decode_s_per_token=1e-3)
    specs = [steady] * 3 + [EngineSpec(**{**_fields(steady), "slowdown": 4.0})]
    routing = {"policy": "engine_load"}
    async with fleet(sqlite_dsn, specs, engine=ENGINE, routing=routing) as (gw, _):
        await fresh_readings(gw, 4)
        client = openai.AsyncOpenAI(base_url=gw.v1, api_key="unused", max_retries=0)
        counts: Counter[str] = Counter()

        async def worker() -> None:
            for _ in range(8):
                counts[await served_by(client, [{"role": "user", "content": prompt()}])] += 1

        await asyncio.gather(*(worker() for _ in range(8)))
        await client.close()

    assert 64 == sum(counts.values())
    assert counts["e3"] < 0.15 * 64, counts


async def test_a_faulted_gpus_endpoints_get_nothing_even_when_they_hold_the_prompt(
    sqlite_dsn: str,
) -> None:
    async with contextlib.AsyncExitStack() as stack:
        exporter = await stack.enter_async_context(FakeExporter(2))
        servers = [
            await stack.enter_async_context(ModelServer([MODEL], name=f"e{i}", engine=FAST))
            for i in range(2)
        ]
        ups = [upstream(f"u{i}", [s.url], [MODEL], gpu_ids=[i]) for i, s in enumerate(servers)]
        health = {"dcgm_url": exporter.metrics_url, "poll_s": 0.1, "staleness_s": 60}
        gw = await stack.enter_async_context(
            serving(make_config(sqlite_dsn, ups, gpu_health=health))
        )
        client = openai.AsyncOpenAI(base_url=gw.v1, api_key="unused", max_retries=0)
        system = {"role": "system", "content": prompt(400)}
        first = await served_by(client, [system, {"role": "user", "content": "one"}])
        faulted = int(first[1:])
        exporter.set_gpu(faulted, xid=79)
        monitor = gw.gateway.monitor
        assert monitor is not None
        await eventually(lambda: monitor.guard(f"u{faulted}") is not None, what="the fault")

        later = {
            await served_by(client, [system, {"role": "user", "content": f"q{i}"}])
            for i in range(10)
        }
        await client.close()

    assert {f"e{1 - faulted}"} == later


async def test_a_session_stays_on_its_engine_and_other_sessions_spread(sqlite_dsn: str) -> None:
    async with fleet(sqlite_dsn, [FAST] * 3) as (gw, _):
        client = openai.AsyncOpenAI(base_url=gw.v1, api_key="unused", max_retries=0)
        homes: dict[str, set[str]] = {}
        for turn in range(4):
            for session in ("s-1", "s-2", "s-3", "s-4", "s-5", "s-6"):
                messages = [{"role": "user", "content": f"{session} turn {turn}"}]
                headers = {"X-Session-Id": session}
                engine = await served_by(client, messages, extra_headers=headers)
                homes.setdefault(session, set()).add(engine)
        await client.close()

    assert all(1 == len(engines) for engines in homes.values()), homes
    assert 1 < len({next(iter(engines)) for engines in homes.values()})


async def test_requests_for_a_lora_adapter_go_to_the_engine_where_it_is_resident(
    sqlite_dsn: str,
) -> None:
    spec = EngineSpec(
        max_seqs=8, prefill_s_per_token=0.0, decode_s_per_token=5e-3, lora_adapters=("sql",)
    )
    models = [MODEL, "sql"]
    async with (
        fleet(sqlite_dsn, [spec] * 3, models, engine=ENGINE) as (gw, servers),
        aiohttp.ClientSession() as http,
    ):
        # a long generation for the adapter keeps it resident on e1 (vLLM lists the adapters of
        # running requests in vllm:lora_requests_info)
        long = {"model": "sql", "prompt": "warm", "max_tokens": 127, "stream": True}
        held = asyncio.create_task(_read(http, f"{servers[1].url}/v1/completions", long))
        engine = servers[1].engine
        assert engine is not None
        await eventually(lambda: engine.running == 1, what="the adapter running on e1")
        monitor = gw.gateway.engine_monitor
        assert monitor is not None
        await eventually(
            lambda: "sql" in _loras(monitor, servers[1].url), what="a reading naming the adapter"
        )
        client = openai.AsyncOpenAI(base_url=gw.v1, api_key="unused", max_retries=0)
        engines = [
            await served_by(client, [{"role": "user", "content": prompt(20)}], model="sql",
                            max_tokens=1)
            for _ in range(6)
        ]  # fmt: skip
        await client.close()
        held.cancel()
        await asyncio.gather(held, return_exceptions=True)

    assert ["e1"] * 6 == engines


def _loras(monitor: Any, url: str) -> frozenset[str]:
    endpoint = monitor.endpoints.get(("u", url))
    return endpoint.reading.loras if endpoint is not None and endpoint.reading else frozenset()


async def _read(http: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> None:
    async with http.post(url, json=body) as response:
        await response.read()


def _fields(spec: EngineSpec) -> dict[str, Any]:
    return {name: getattr(spec, name) for name in spec.__dataclass_fields__}


async def test_an_endpoint_removed_by_a_new_config_leaves_the_prefix_index(
    sqlite_dsn: str,
) -> None:
    async with fleet(sqlite_dsn, [FAST, FAST]) as (gw, servers):
        client = openai.AsyncOpenAI(base_url=gw.v1, api_key="unused", max_retries=0)
        system = {"role": "system", "content": prompt(200)}
        await served_by(client, [system, {"role": "user", "content": "q"}])
        await client.close()
        router = gw.gateway.proxy.router
        assert router is not None
        assert "blocks=0" not in repr(router)

        gone = make_config(sqlite_dsn, [upstream("u", [servers[0].url], [MODEL])])
        kept = make_config(sqlite_dsn, [upstream("u", [servers[1].url], [MODEL])])
        for config in (gone, kept):
            gw.gateway.apply_config(config, gw.gateway.config_version + 1)

    assert "blocks=0" in repr(router)
