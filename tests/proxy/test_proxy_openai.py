"""The real `openai` client through the gateway, against the simulated fleet (DESIGN §3)."""

from __future__ import annotations

import openai

from harness import make_config, model_servers, serving, upstream


async def test_async_openai_client_chats_streams_and_embeds_through_the_gateway(
    sqlite_dsn: str,
) -> None:
    async with model_servers(("chat", ["qwen-35b"]), ("tei", ["bge-m3"])) as (chat, tei):
        config = make_config(
            sqlite_dsn,
            [upstream("qwen", [chat.url], ["qwen-35b"]), upstream("tei", [tei.url], ["bge-m3"])],
        )
        async with serving(config) as gw:
            client = openai.AsyncOpenAI(base_url=gw.v1, api_key="unused", max_retries=0)
            reply = await client.chat.completions.create(
                model="qwen-35b", messages=[{"role": "user", "content": "hello"}]
            )
            assert reply.choices[0].message.content
            stream = await client.chat.completions.create(
                model="qwen-35b", messages=[{"role": "user", "content": "hello"}], stream=True
            )
            pieces = [
                c.choices[0].delta.content
                async for c in stream
                if c.choices and c.choices[0].delta.content
            ]
            assert reply.choices[0].message.content == "".join(pieces)
            emb = await client.embeddings.create(model="bge-m3", input=["a", "b"])
            assert 2 == len(emb.data)
            models = await client.models.list()
            assert ["bge-m3", "qwen-35b"] == sorted(m.id for m in models.data)
            await client.close()
