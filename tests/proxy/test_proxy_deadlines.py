"""Deadlines and held headers (issue #13, #14.12a): a stream's headers wait for its first data
event, so a bad start is retried before the client sees a byte; silence is bounded."""

from __future__ import annotations

import time

import openai
import pytest

from harness import make_config, serving, upstream
from scripted_upstream import OK, WORDS, Step, answer_text, scripted

CHAT = [{"role": "user", "content": "hi"}]
FAST = {"attempts": 3, "backoff_s": 0.01, "max_backoff_s": 0.05, "retry_after_max_s": 5}


async def stream_text(base_url: str) -> tuple[str, str]:
    """The streamed answer's text through the real ``openai`` client, and the attempts."""
    client = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0)
    try:
        raw = await client.chat.completions.with_raw_response.create(
            model="m",
            messages=CHAT,  # type: ignore[arg-type]
            stream=True,
        )
        parts = [
            chunk.choices[0].delta.content or "" async for chunk in raw.parse() if chunk.choices
        ]
        return "".join(parts), raw.headers["x-gateway-attempts"]
    finally:
        await client.close()


@pytest.mark.parametrize(
    "bad_start",
    [
        Step(first_event_error=True),
        Step(events=0, cut=True),
        Step(status=503),
    ],
    ids=["error-in-first-event", "200-then-reset", "503"],
)
async def test_a_stream_that_starts_badly_is_retried_invisibly(
    sqlite_dsn: str, bad_start: Step
) -> None:
    async with scripted(bad_start, OK) as server:
        config = make_config(sqlite_dsn, [upstream("u", [server.url], ["m"], retry=FAST)])
        async with serving(config) as gw:
            text, attempts = await stream_text(gw.v1)
    assert (answer_text(WORDS), "2") == (text, attempts)
    assert 2 == server.count


async def test_a_200_then_nothing_is_cut_at_first_token_timeout_and_retried_elsewhere(
    sqlite_dsn: str,
) -> None:
    async with scripted(Step(events=0, stall_s=30), name="a") as a, scripted(OK, name="b") as b:
        config = make_config(
            sqlite_dsn,
            [upstream("u", [a.url, b.url], ["m"], retry=FAST, first_token_timeout_s=0.5)],
        )
        async with serving(config) as gw:
            gw.gateway.registry.upstream("u").endpoints[1].backoff_until = time.monotonic() + 1
            started = time.monotonic()
            text, _ = await stream_text(gw.v1)
            elapsed = time.monotonic() - started
    assert answer_text(WORDS) == text
    assert (1, 1) == (a.count, b.count)
    assert 0.5 <= elapsed < 3.0


async def test_a_frozen_upstream_no_longer_holds_a_request_for_300_s(sqlite_dsn: str) -> None:
    """#14.12a: headers never come; the first-byte deadline answers 504 within it, not
    ``timeout_s`` later (no other endpoint: a silent one is not waited on twice)."""
    async with scripted(Step(hang_s=60)) as server:
        config = make_config(
            sqlite_dsn,
            [upstream("u", [server.url], ["m"], retry=FAST, first_byte_timeout_s=0.5)],
        )
        async with serving(config) as gw:
            client = openai.AsyncOpenAI(base_url=gw.v1, api_key="unused", max_retries=0)
            started = time.monotonic()
            with pytest.raises(openai.APIStatusError) as caught:
                await client.chat.completions.create(model="m", messages=CHAT)  # type: ignore[arg-type]
            elapsed = time.monotonic() - started
            await client.close()
    assert 504 == caught.value.status_code
    assert 1 == server.count
    assert 0.5 <= elapsed < 3.0


async def test_a_stream_that_stalls_mid_way_ends_with_an_error_event_after_the_idle_timeout(
    sqlite_dsn: str,
) -> None:
    """No continuation possible (one endpoint, a non-deterministic request): the stall ends
    the stream cleanly with ``event: error`` at ``stream_idle_timeout_s``, never a hang."""
    async with scripted(Step(events=10, stall_s=30)) as server:
        config = make_config(
            sqlite_dsn,
            [upstream("u", [server.url], ["m"], retry=FAST, stream_idle_timeout_s=0.5)],
        )
        async with serving(config) as gw:
            started = time.monotonic()
            with pytest.raises(openai.APIError):
                await stream_text(gw.v1)
            elapsed = time.monotonic() - started
    assert 0.5 <= elapsed < 3.0
