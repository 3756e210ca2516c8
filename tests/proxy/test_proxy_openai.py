"""The real `openai` client through the gateway, against the simulated fleet (DESIGN §3)."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import openai

from gpugate.fleet import ServerBehaviour
from harness import make_config, model_servers, serving, upstream

CHAT = [{"role": "user", "content": "hello there"}]


async def test_async_client_chats_streams_embeds_and_lists_models(sqlite_dsn: str) -> None:
    async with model_servers(("chat", ["qwen-35b"]), ("tei", ["bge-m3"])) as (chat, tei):
        config = make_config(
            sqlite_dsn,
            [upstream("qwen", [chat.url], ["qwen-35b"]), upstream("tei", [tei.url], ["bge-m3"])],
        )
        async with serving(config) as gw:
            client = openai.AsyncOpenAI(base_url=gw.v1, api_key="unused", max_retries=0)
            reply = await client.chat.completions.create(model="qwen-35b", messages=CHAT)
            stream = await client.chat.completions.create(
                model="qwen-35b", messages=CHAT, stream=True
            )
            pieces = [c.choices[0].delta.content async for c in stream if c.choices]
            emb = await client.embeddings.create(model="bge-m3", input=["a", "b"])
            completion = await client.completions.create(model="qwen-35b", prompt="say hi")
            models = await client.models.list()
            await client.close()
    assert reply.choices[0].message.content == "".join(p or "" for p in pieces)
    assert "chat answers: hello there" == reply.choices[0].message.content
    assert 2 == len(emb.data)
    assert completion.choices[0].text
    assert ["bge-m3", "qwen-35b"] == sorted(m.id for m in models.data)


async def test_sync_client_chats_and_streams_through_the_gateway(sqlite_dsn: str) -> None:
    async with model_servers(("chat", ["qwen-35b"])) as (chat,):
        config = make_config(sqlite_dsn, [upstream("qwen", [chat.url], ["qwen-35b"])])
        async with serving(config) as gw:

            def use_sync_client() -> tuple[str, str]:
                with openai.OpenAI(base_url=gw.v1, api_key="unused", max_retries=0) as client:
                    reply = client.chat.completions.create(model="qwen-35b", messages=CHAT)
                    stream = client.chat.completions.create(
                        model="qwen-35b", messages=CHAT, stream=True
                    )
                    streamed = "".join(
                        c.choices[0].delta.content or "" for c in stream if c.choices
                    )
                    return reply.choices[0].message.content or "", streamed

            whole, streamed = await asyncio.to_thread(use_sync_client)
    assert "chat answers: hello there" == whole
    assert whole == streamed


async def test_responses_carry_the_upstream_and_the_gateway_overhead(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    async with model_servers(("chat", ["qwen-35b"])) as (chat,):
        config = make_config(sqlite_dsn, [upstream("qwen", [chat.url], ["qwen-35b"])])
        async with serving(config) as gw:
            body = {"model": "qwen-35b", "messages": CHAT}
            async with http.post(gw.v1 + "/chat/completions", json=body) as resp:
                assert 200 == resp.status
                assert "qwen" == resp.headers["X-Gateway-Upstream"]
                overhead_ms = float(resp.headers["X-Gateway-Overhead-Ms"])
            async with http.get(gw.url + "/metrics") as resp:
                metrics = await resp.text()
    assert 0 <= overhead_ms < 1000
    labels = 'class="interactive",code="200",model="qwen-35b",upstream="qwen"'
    assert f"gateway_requests_total{{{labels}}} 1.0" in metrics
    assert "gateway_overhead_seconds_count 1.0" in metrics


async def test_the_slower_of_two_endpoints_gets_measurably_fewer_requests(sqlite_dsn: str) -> None:
    """Least outstanding requests with two choices: a 10x slower endpoint keeps more in flight,
    so it is picked less."""
    async with (
        model_servers(("fast", ["m"]), behaviour=ServerBehaviour(delay_s=0.01)) as (fast,),
        model_servers(("slow", ["m"]), behaviour=ServerBehaviour(delay_s=0.1)) as (slow,),
    ):
        config = make_config(sqlite_dsn, [upstream("m", [fast.url, slow.url], ["m"])])
        async with serving(config) as gw:
            client = openai.AsyncOpenAI(base_url=gw.v1, api_key="unused", max_retries=0)

            async def worker() -> None:
                for _ in range(10):
                    await client.chat.completions.create(model="m", messages=CHAT)

            await asyncio.gather(*(worker() for _ in range(6)))
            await client.close()
    to_fast = fast.stats.requests["/v1/chat/completions"]
    to_slow = slow.stats.requests["/v1/chat/completions"]
    assert 60 == to_fast + to_slow
    assert to_slow * 2 < to_fast, f"fast={to_fast} slow={to_slow}"


async def test_a_stream_is_relayed_chunk_by_chunk_as_the_upstream_sends_it(sqlite_dsn: str) -> None:
    n = 5
    behaviour = ServerBehaviour(chunk_delay_s=0.2, chunks=n)
    async with model_servers(("chat", ["m"]), behaviour=behaviour) as (chat,):
        config = make_config(sqlite_dsn, [upstream("m", [chat.url], ["m"])])
        async with serving(config) as gw:
            client = openai.AsyncOpenAI(base_url=gw.v1, api_key="unused", max_retries=0)
            stream = await client.chat.completions.create(model="m", messages=CHAT, stream=True)
            arrivals = [
                time.monotonic() async for c in stream if c.choices and c.choices[0].delta.content
            ]
            await client.close()
    assert n == len(arrivals)
    assert arrivals[-1] - arrivals[0] >= (n - 1) * 0.2 * 0.95, arrivals
