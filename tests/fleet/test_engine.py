"""The simulated engine: slots and a queue, a KV cache with prefix reuse and LRU eviction,
vLLM's metrics — behind a real fake model server on a loopback port."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpugate.fleet import EngineSpec, ModelServer
from gpugate.fleet.engine import Engine, block_hashes, chat_tokens

Until = Callable[..., Awaitable[None]]
MODEL = "alpha-7b"
SYSTEM = " ".join(f"rule{i}" for i in range(200))  # 200 tokens: 12 full blocks of 16


def chat(*turns: tuple[str, str], **extra: Any) -> dict[str, Any]:
    messages = [{"role": "system", "content": SYSTEM}]
    messages += [{"role": role, "content": text} for role, text in turns]
    return {"model": MODEL, "messages": messages, **extra}


@pytest.fixture
async def engine_server() -> AsyncIterator[ModelServer]:
    spec = EngineSpec(max_seqs=2, kv_blocks=64, prefill_s_per_token=0.0, decode_s_per_token=0.0)
    async with ModelServer([MODEL, "sql-lora"], name="alpha", engine=spec) as running:
        yield running


async def post(http: aiohttp.ClientSession, server: ModelServer, body: dict[str, Any]) -> Any:
    async with http.post(f"{server.url}/v1/chat/completions", json=body) as response:
        return response.status, await response.json()


async def metrics(http: aiohttp.ClientSession, server: ModelServer) -> dict[str, float]:
    async with http.get(f"{server.url}/metrics") as response:
        text = await response.text()
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}


async def test_a_repeated_system_prompt_is_served_from_the_prefix_cache(
    engine_server: ModelServer, http: aiohttp.ClientSession
) -> None:
    await post(http, engine_server, chat(("user", "first question")))
    await post(http, engine_server, chat(("user", "another question")))

    seen = await metrics(http, engine_server)
    prompt = len(chat_tokens(chat(("user", "first question"))["messages"]))
    assert 2 * prompt == seen["vllm:prefix_cache_queries_total"]
    assert 12 * 16 == seen["vllm:prefix_cache_hits_total"]  # the system prompt's full blocks


async def test_the_next_turn_of_a_chat_hits_on_the_whole_previous_turn_answer_included(
    engine_server: ModelServer, http: aiohttp.ClientSession
) -> None:
    _, first = await post(http, engine_server, chat(("user", "tell me more"), max_tokens=40))
    answer = first["choices"][0]["message"]["content"]
    history = chat(("user", "tell me more"), ("assistant", answer), ("user", "and then"))
    engine = engine_server.engine
    assert engine is not None

    cached = engine.cached_prefix_tokens(chat_tokens(history["messages"]))

    turn_one = chat_tokens(chat(("user", "tell me more"))["messages"]) + answer.split()
    assert len(turn_one) // 16 * 16 == cached


async def test_a_full_cache_evicts_the_least_recently_used_blocks_tail_first(
    http: aiohttp.ClientSession,
) -> None:
    """20 blocks; each request needs 11 (160 prompt tokens and one answer token): the second
    takes the 9 empty blocks and evicts the last 2 of the first prompt's."""
    spec = EngineSpec(kv_blocks=20, prefill_s_per_token=0.0, decode_s_per_token=0.0)
    async with ModelServer([MODEL], name="small", engine=spec) as server:
        old = {"model": MODEL, "prompt": " ".join(f"old{i}" for i in range(160)), "max_tokens": 1}
        new = {"model": MODEL, "prompt": " ".join(f"new{i}" for i in range(160)), "max_tokens": 1}
        for body in (old, new):
            async with http.post(f"{server.url}/v1/completions", json=body) as response:
                assert 200 == response.status
        engine = server.engine
        assert engine is not None

        assert (20 - 11) * 16 == engine.cached_prefix_tokens(old["prompt"].split())
        assert 160 == engine.cached_prefix_tokens(new["prompt"].split())


async def test_requests_beyond_max_seqs_wait_and_the_gauges_say_so(
    http: aiohttp.ClientSession, until: Until
) -> None:
    spec = EngineSpec(max_seqs=1, prefill_s_per_token=0.0, decode_s_per_token=3600.0)
    async with ModelServer([MODEL], name="busy", engine=spec) as server:
        body = chat(("user", "hold"), max_tokens=2, stream=True)
        tasks = [asyncio.create_task(post(http, server, body)) for _ in range(3)]
        engine = server.engine
        assert engine is not None
        await until(lambda: engine.running == 1 and engine.waiting == 2)

        seen = await metrics(http, server)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

        assert (1.0, 2.0) == (seen["vllm:num_requests_running"], seen["vllm:num_requests_waiting"])
        assert 0 < seen["vllm:kv_cache_usage_perc"] <= 1
        await until(lambda: engine.running == 0 and engine.waiting == 0)


async def test_clients_that_leave_free_their_slot_and_their_place_in_the_queue() -> None:
    engine = Engine(EngineSpec(max_seqs=1, decode_s_per_token=3600.0, prefill_s_per_token=0.0))

    async def hold() -> None:
        async with engine.run(MODEL, ["a"] * 40, 2) as active:
            await active.step()
            await active.step()

    first = asyncio.create_task(hold())
    second = asyncio.create_task(hold())
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert (1, 1) == (engine.running, engine.waiting)
    for task in (first, second):
        task.cancel()
    await asyncio.gather(first, second, return_exceptions=True)

    assert (0, 0, 0.0) == (engine.running, engine.waiting, engine.kv_usage)


async def test_a_sequence_larger_than_the_cache_is_refused_as_too_long(
    engine_server: ModelServer, http: aiohttp.ClientSession
) -> None:
    status, body = await post(http, engine_server, chat(("user", "x " * 2000)))

    assert 400 == status
    assert "context_length_exceeded" == body["error"]["code"]


async def test_lora_requests_info_names_the_adapters_of_running_requests(
    http: aiohttp.ClientSession, until: Until
) -> None:
    spec = EngineSpec(decode_s_per_token=3600.0, prefill_s_per_token=0.0, lora_adapters=("sql",))
    async with ModelServer([MODEL, "sql"], name="lora", engine=spec) as server:
        body = {"model": "sql", "prompt": "select", "max_tokens": 2, "stream": True}
        task = asyncio.create_task(post_text(http, server, body))
        engine = server.engine
        assert engine is not None
        await until(lambda: engine.running == 1)

        async with http.get(f"{server.url}/metrics") as response:
            text = await response.text()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    info = [
        s.labels
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "vllm:lora_requests_info"
    ]
    assert [{"max_lora": "2", "running_lora_adapters": "sql", "waiting_lora_adapters": ""}] == info


async def post_text(http: aiohttp.ClientSession, server: ModelServer, body: dict[str, Any]) -> int:
    async with http.post(f"{server.url}/v1/completions", json=body) as response:
        await response.read()
        return response.status


async def test_the_engine_streams_one_chunk_per_token(
    engine_server: ModelServer, http: aiohttp.ClientSession
) -> None:
    body = chat(("user", "stream it"), max_tokens=5, stream=True)
    async with http.post(f"{engine_server.url}/v1/chat/completions", json=body) as response:
        text = await response.text()

    content_events = [line for line in text.split("\n") if '"content":"' in line]
    assert 1 + 5 == len(content_events)  # the role chunk, then one per token


def test_block_hashes_are_chained_so_a_block_names_everything_before_it() -> None:
    a = block_hashes(["x"] * 16 + ["y"] * 16, 16)
    b = block_hashes(["z"] * 16 + ["y"] * 16, 16)

    assert 2 == len(a) == len(b)
    assert a[1] != b[1]  # the same second block after a different first one
    assert [] == block_hashes(["x"] * 15, 16)  # no full block, no hash


async def test_engine_knobs_change_at_runtime_and_bad_ones_are_refused(
    engine_server: ModelServer, http: aiohttp.ClientSession
) -> None:
    url = f"{engine_server.url}/_control/engine"
    async with http.post(url, json={"slowdown": 4}) as response:
        assert (200, 4.0) == (response.status, (await response.json())["slowdown"])
    async with http.post(url, json={"kv_blocks": 4}) as response:
        assert 400 == response.status
