"""Each control of the fake model server changes how it answers."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

import openai
import pytest
from openai import AsyncOpenAI

from gpugate.fleet import ControlError, ModelServer, ServerBehaviour

if TYPE_CHECKING:
    import aiohttp
    from openai.types.chat import ChatCompletionMessageParam

Until = Callable[[Callable[[], bool]], Awaitable[None]]
MODEL = "alpha-7b"
HI: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]


@pytest.fixture
async def client(server: ModelServer) -> AsyncIterator[AsyncOpenAI]:
    async with AsyncOpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0) as c:
        yield c


async def chat(client: AsyncOpenAI, **options: Any) -> str | None:
    completion = await client.chat.completions.create(model=MODEL, messages=HI, **options)
    content: str | None = completion.choices[0].message.content
    return content


async def test_fail_status_answers_with_that_status_and_an_openai_error(
    server: ModelServer, client: AsyncOpenAI
) -> None:
    server.update(fail_status=503)

    with pytest.raises(openai.InternalServerError) as caught:
        await chat(client)

    assert 503 == caught.value.status_code
    assert isinstance(caught.value.body, dict)
    assert "injected" == caught.value.body["code"]


async def test_delay_holds_the_answer_for_that_long(
    server: ModelServer, client: AsyncOpenAI
) -> None:
    server.update(delay_s=0.3)
    started = time.monotonic()

    await chat(client)

    assert time.monotonic() - started >= 0.3


async def test_hang_outlasts_a_client_timeout_and_the_disconnect_is_counted(
    server: ModelServer, client: AsyncOpenAI, until: Until
) -> None:
    server.update(hang=True)

    with pytest.raises(openai.APITimeoutError):
        await chat(client, timeout=0.3)

    await until(lambda: server.stats.disconnects == 1)
    assert 0 == server.stats.open_requests


async def test_requests_held_by_hang_carry_on_when_hang_is_turned_off(
    server: ModelServer, client: AsyncOpenAI, until: Until
) -> None:
    server.update(hang=True)
    held = asyncio.create_task(chat(client))
    await until(lambda: server.stats.open_requests == 1)

    server.update(hang=False)

    assert "alpha answers: hi" == await held


async def test_reset_after_chunks_aborts_the_stream_after_that_many_chunks(
    server: ModelServer, client: AsyncOpenAI
) -> None:
    server.update(reset_after_chunks=3)
    received: list[str] = []

    async def read_all() -> None:
        stream = await client.chat.completions.create(model=MODEL, messages=HI, stream=True)
        async for chunk in stream:
            received.append(chunk.choices[0].delta.content or "")  # noqa: PERF401 - kept on error

    with pytest.raises(openai.APIConnectionError):
        await read_all()

    assert 1 + 3 == len(received)  # the role chunk and three content chunks, then the reset
    assert 1 == server.stats.resets


async def test_drop_connection_aborts_before_any_answer(
    server: ModelServer, client: AsyncOpenAI
) -> None:
    server.update(drop_connection=True)

    with pytest.raises(openai.APIConnectionError):
        await chat(client)

    assert 1 == server.stats.resets


async def test_chunks_sets_how_many_content_chunks_a_stream_has(
    server: ModelServer, client: AsyncOpenAI
) -> None:
    server.update(chunks=3)

    stream = await client.chat.completions.create(model=MODEL, messages=HI, stream=True)
    contents = [c.choices[0].delta.content async for c in stream if c.choices]

    assert 3 == len([content for content in contents if content])


async def test_health_answers_the_configured_status(
    server: ModelServer, http: aiohttp.ClientSession
) -> None:
    async with http.get(f"{server.url}/health") as healthy:
        assert 200 == healthy.status
    server.update(health_status=503)

    async with http.get(f"{server.url}/health") as sick:
        assert 503 == sick.status


async def test_control_api_applies_a_partial_update_and_shows_the_behaviour(
    server: ModelServer, http: aiohttp.ClientSession
) -> None:
    async with http.post(f"{server.url}/_control", json={"fail_status": 429}) as response:
        assert 200 == response.status
    async with http.get(f"{server.url}/_control") as response:
        shown = await response.json()

    assert ServerBehaviour(fail_status=429).as_json() == shown
    assert 429 == server.behaviour.fail_status


async def test_control_api_refuses_unknown_fields_and_bad_values_and_changes_nothing(
    server: ModelServer, http: aiohttp.ClientSession
) -> None:
    for bad in ({"nope": 1}, {"delay_s": "slow"}, {"hang": 1}, {"fail_status": 200}):
        async with http.post(f"{server.url}/_control", json=bad) as response:
            assert 400 == response.status, bad

    assert ServerBehaviour() == server.behaviour


def test_update_in_process_is_validated_like_the_control_api() -> None:
    server = ModelServer(["m"], name="s")

    with pytest.raises(ControlError, match="chunks"):
        server.update(chunks=0)


async def test_control_reset_restores_the_behaviour_and_zeroes_the_counters(
    server: ModelServer, client: AsyncOpenAI, http: aiohttp.ClientSession
) -> None:
    await chat(client)
    server.update(delay_s=2.0, fail_status=500)

    async with http.post(f"{server.url}/_control/reset") as response:
        assert 200 == response.status

    assert ServerBehaviour() == server.behaviour
    assert 0 == server.stats.requests["/v1/chat/completions"]
