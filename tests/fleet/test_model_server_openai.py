"""The real `openai` client talks to the fake model server."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

import pytest
from openai import AsyncOpenAI, OpenAI

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator

    from openai.types.chat import ChatCompletionMessageParam

    from gpugate.fleet import ModelServer

MODEL = "alpha-7b"


@pytest.fixture
async def client(server: ModelServer) -> AsyncIterator[AsyncOpenAI]:
    async with AsyncOpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0) as c:
        yield c


@pytest.fixture
def sync_client(server: ModelServer) -> Iterator[OpenAI]:
    with OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0) as c:
        yield c


def say(text: str) -> list[ChatCompletionMessageParam]:
    return [{"role": "system", "content": "be brief"}, {"role": "user", "content": text}]


async def test_sync_client_gets_a_chat_completion_naming_the_server_and_echoing_the_prompt(
    sync_client: OpenAI,
) -> None:
    completion = await asyncio.to_thread(
        sync_client.chat.completions.create, model=MODEL, messages=say("hello there")
    )

    assert "alpha answers: hello there" == completion.choices[0].message.content
    assert "chat.completion" == completion.object
    assert MODEL == completion.model
    assert "assistant" == completion.choices[0].message.role
    assert "stop" == completion.choices[0].finish_reason
    assert completion.usage is not None
    assert 4 == completion.usage.prompt_tokens
    assert 8 == completion.usage.completion_tokens


async def test_sync_client_lists_the_models(sync_client: OpenAI) -> None:
    models = await asyncio.to_thread(sync_client.models.list)

    assert [MODEL] == [model.id for model in models.data]


async def test_sync_client_streams_a_chat_that_joins_to_the_non_streamed_content(
    sync_client: OpenAI,
) -> None:
    def stream() -> list[str | None]:
        chunks = sync_client.chat.completions.create(
            model=MODEL, messages=say("stream me"), stream=True
        )
        return [c.choices[0].delta.content for c in chunks if c.choices]

    contents = await asyncio.to_thread(stream)

    assert "alpha answers: stream me" == "".join(c or "" for c in contents)
    assert 1 + 8 + 1 == len(contents)  # role chunk, 8 content chunks, finish chunk


async def test_async_client_gets_a_chat_completion(client: AsyncOpenAI) -> None:
    completion = await client.chat.completions.create(model=MODEL, messages=say("hi"))

    assert "alpha answers: hi" == completion.choices[0].message.content


async def test_async_chat_stream_ends_with_finish_reason_and_usage_when_asked(
    client: AsyncOpenAI,
) -> None:
    stream = await client.chat.completions.create(
        model=MODEL,
        messages=say("count words"),
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [chunk async for chunk in stream]

    finish = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert ["stop"] == [reason for reason in finish if reason is not None]
    assert chunks[-1].usage is not None
    assert 8 == chunks[-1].usage.completion_tokens
    assert "alpha answers: count words" == "".join(
        c.choices[0].delta.content or "" for c in chunks if c.choices
    )


async def test_chat_stream_is_incremental_with_a_chunk_delay(
    server: ModelServer, client: AsyncOpenAI
) -> None:
    server.update(chunk_delay_s=0.2, chunks=5)
    stream = await client.chat.completions.create(model=MODEL, messages=say("slow"), stream=True)
    arrivals = [time.monotonic() async for _ in stream]

    assert 1 + 5 + 1 == len(arrivals)
    assert arrivals[-1] - arrivals[0] >= 0.6


async def test_async_client_gets_a_text_completion(client: AsyncOpenAI) -> None:
    completion = await client.completions.create(model=MODEL, prompt="once upon")

    assert "alpha answers: once upon" == completion.choices[0].text
    assert "text_completion" == completion.object


async def test_async_client_streams_a_text_completion(client: AsyncOpenAI) -> None:
    stream = await client.completions.create(model=MODEL, prompt="once upon", stream=True)
    texts = [chunk.choices[0].text async for chunk in stream if chunk.choices]

    assert "alpha answers: once upon" == "".join(texts)


async def test_async_client_gets_deterministic_embeddings_of_the_configured_dimension(
    client: AsyncOpenAI,
) -> None:
    first = await client.embeddings.create(model=MODEL, input=["a", "b"])
    again = await client.embeddings.create(model=MODEL, input="a")

    assert [8, 8] == [len(item.embedding) for item in first.data]
    assert first.data[0].embedding == again.data[0].embedding
    assert first.data[0].embedding != first.data[1].embedding


async def test_embeddings_as_floats_equal_the_base64_ones_the_client_decodes(
    client: AsyncOpenAI,
) -> None:
    floats = await client.embeddings.create(model=MODEL, input="x", encoding_format="float")
    decoded = await client.embeddings.create(model=MODEL, input="x")

    assert floats.data[0].embedding == pytest.approx(decoded.data[0].embedding, abs=1e-6)
