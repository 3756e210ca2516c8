"""A Fleet runs several fake model servers and one fake exporter, and stops them promptly."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

import aiohttp
import pytest
from openai import AsyncOpenAI

from gpugate.fleet import (
    EXPORTER,
    ExporterSpec,
    Fleet,
    FleetSpec,
    ModelServer,
    ServerBehaviour,
    ServerSpec,
    demo_spec,
    serve_forever,
)
from ports import free_port

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable


def two_servers(**behaviour: Any) -> FleetSpec:
    return FleetSpec(
        servers=[
            ServerSpec(name="a", models=["m-a"], behaviour=ServerBehaviour(**behaviour)),
            ServerSpec(name="b", models=["m-b", "m-b2"]),
        ],
        gpus=3,
        exporter=ExporterSpec(hostname="node-z"),
    )


async def test_demo_fleet_serves_each_model_from_its_own_server() -> None:
    async with Fleet(demo_spec()) as fleet:
        answers = {}
        for name, server in fleet.servers.items():
            async with AsyncOpenAI(base_url=f"{server.url}/v1", api_key="x") as client:
                models = await client.models.list()
                answers[name] = [model.id for model in models.data]

    assert {
        "qwen-35b": ["qwen-35b"],
        "qwen-7b": ["qwen-7b"],
        "cleanup-3b": ["cleanup-3b"],
        "tei-embeddings": ["bge-m3"],
        "doc-classifier": ["doc-classifier"],
    } == answers
    assert 2 == len(fleet.exporter.gpus)


async def test_each_server_answers_under_its_own_name(http: aiohttp.ClientSession) -> None:
    async with Fleet(two_servers()) as fleet:
        body = {"model": "m-b2", "messages": [{"role": "user", "content": "who"}]}
        async with http.post(f"{fleet.servers['b'].url}/v1/chat/completions", json=body) as r:
            answer = await r.json()
        async with http.get(fleet.exporter.metrics_url) as r:
            scrape = await r.text()

    assert "b answers: who" == answer["choices"][0]["message"]["content"]
    assert 'gpu="2"' in scrape
    assert 'Hostname="node-z"' in scrape


async def test_a_server_spec_behaviour_is_the_servers_starting_behaviour() -> None:
    async with Fleet(two_servers(fail_status=502)) as fleet:
        assert 502 == fleet.servers["a"].behaviour.fail_status
        fleet.servers["a"].update(fail_status=None)
        fleet.servers["a"].reset()

        assert 502 == fleet.servers["a"].behaviour.fail_status


async def test_describe_prints_name_url_and_models_per_member() -> None:
    async with Fleet(two_servers()) as fleet:
        lines = fleet.describe()
        url_a, url_b = fleet.servers["a"].url, fleet.servers["b"].url

    assert 3 == len(lines)
    assert [url_a, "m-a"] == lines[0].split()[1:]
    assert [url_b, "m-b,", "m-b2"] == lines[1].split()[1:]
    assert lines[2].startswith(EXPORTER)
    assert lines[0].index(url_a) == lines[1].index(url_b)  # aligned columns


async def test_fixed_ports_are_used() -> None:
    port = free_port()

    async with Fleet(two_servers(), ports={"b": port}) as fleet:
        assert f"http://127.0.0.1:{port}" == fleet.servers["b"].url


def test_ports_for_unknown_members_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown servers"):
        Fleet(two_servers(), ports={"c": 1234})


def test_duplicate_server_names_are_refused() -> None:
    with pytest.raises(ValueError, match="unique"):
        FleetSpec(servers=[ServerSpec(name="a", models=["x"]), ServerSpec(name="a", models=["y"])])


def test_a_server_may_not_take_the_exporters_name() -> None:
    with pytest.raises(ValueError, match="names the exporter"):
        ServerSpec(name=EXPORTER, models=["x"])


async def test_stopping_closes_an_open_stream_promptly() -> None:
    fleet = Fleet(two_servers(chunk_delay_s=1.0, chunks=100))
    await fleet.start()
    url = f"{fleet.servers['a'].url}/v1/chat/completions"
    body = {"model": "m-a", "messages": [{"role": "user", "content": "x"}], "stream": True}

    async with aiohttp.ClientSession() as http, http.post(url, json=body) as response:
        await response.content.readuntil(b"\n\n")
        started = time.monotonic()
        await fleet.stop()
        with pytest.raises(aiohttp.ClientPayloadError):
            await response.read()

    assert time.monotonic() - started < 1.0


async def test_stopping_answers_a_hung_request_with_a_closed_connection_promptly(
    until: Callable[[Callable[[], bool]], Awaitable[None]],
) -> None:
    fleet = Fleet(two_servers(hang=True))
    await fleet.start()
    url = f"{fleet.servers['a'].url}/v1/embeddings"

    async with aiohttp.ClientSession() as http:
        held = asyncio.create_task(http.post(url, json={"model": "m-a", "input": "x"}))
        await until(lambda: fleet.servers["a"].stats.open_requests == 1)
        started = time.monotonic()
        await fleet.stop()
        with pytest.raises(aiohttp.ServerDisconnectedError):
            await held

    assert time.monotonic() - started < 1.0


async def test_a_stopped_server_starts_again_on_the_same_port(
    http: aiohttp.ClientSession,
) -> None:
    server = ModelServer(["m"], name="s")
    first = await server.start()
    await server.stop()
    with pytest.raises(aiohttp.ClientConnectionError):
        await http.get(f"{first}/health")

    second = await server.start()
    try:
        async with http.get(f"{second}/health") as response:
            assert 200 == response.status
    finally:
        await server.stop()

    assert first == second


async def test_serve_forever_calls_on_ready_and_stops_when_cancelled(
    http: aiohttp.ClientSession,
) -> None:
    ready: asyncio.Future[Fleet] = asyncio.get_running_loop().create_future()

    serving = asyncio.create_task(serve_forever(two_servers(), on_ready=ready.set_result))
    fleet = await asyncio.wait_for(ready, timeout=5)
    url = fleet.servers["a"].url
    async with http.get(f"{url}/health") as response:
        assert 200 == response.status
    serving.cancel()
    with pytest.raises(asyncio.CancelledError):
        await serving

    with pytest.raises(aiohttp.ClientConnectionError):
        await http.get(f"{url}/health")
