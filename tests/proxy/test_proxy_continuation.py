"""Mid-stream rescue (issue #13): a stream that breaks after bytes reached the client goes on
elsewhere, and the client gets one whole answer — never duplicated or garbled text — or the
terminal ``event: error`` naming the first break when nothing can continue it faithfully."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from gpugate.services.continuation import MAX_CONTINUATIONS
from harness import make_config, serving, upstream
from scripted_upstream import OK, WORDS, Step, answer_text, scripted

CHAT = [{"role": "user", "content": "tell me sixty words"}]
FAST = {"attempts": 2, "backoff_s": 0.01, "max_backoff_s": 0.05, "retry_after_max_s": 5}
FULL = answer_text(WORDS)


async def stream(base_url: str, model: str = "m", **extra: Any) -> str:
    """The streamed answer's text through the real ``openai`` client."""
    client = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0)
    try:
        chunks = await client.chat.completions.create(
            model=model,
            messages=CHAT,  # type: ignore[arg-type]
            stream=True,
            **extra,
        )
        return "".join([c.choices[0].delta.content or "" async for c in chunks if c.choices])
    finally:
        await client.close()


async def collect(base_url: str, got: list[str]) -> None:
    """Stream a temperature-0 answer into ``got`` piece by piece (kept when it raises)."""
    client = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0)
    try:
        chunks = await client.chat.completions.create(
            model="m",
            messages=CHAT,  # type: ignore[arg-type]
            stream=True,
            temperature=0,
        )
        async for chunk in chunks:  # kept piece by piece: the stream raises part-way
            got.append((chunk.choices[0].delta.content or "") if chunk.choices else "")  # noqa: PERF401
    finally:
        await client.close()


BREAKS = {
    "cut-after-40-of-60": Step(events=40, cut=True),
    "clean-close-without-done": Step(events=40, end=True),
    "malformed-event": Step(garbage_at=40),
    "stall-30-s": Step(events=40, stall_s=30),
}


@pytest.mark.parametrize("fault", list(BREAKS.values()), ids=list(BREAKS))
async def test_a_deterministic_stream_broken_mid_way_is_replayed_on_the_same_model(
    sqlite_dsn: str, fault: Step
) -> None:
    """temperature 0, one upstream (continuation: replay): the replay's first 40 words are
    checked against what was delivered and suppressed; the client gets the 60 words once."""
    async with scripted(fault, OK) as server:
        config = make_config(
            sqlite_dsn,
            [upstream("u", [server.url], ["m"], retry=FAST, stream_idle_timeout_s=0.5)],
        )
        async with serving(config) as gw:
            text = await stream(gw.v1, temperature=0)
            metrics = gw.gateway.metrics.continuations.labels("m", "replay")._value.get()
    assert FULL == text
    assert 2 == server.count
    assert server.seen[1].body["messages"] == CHAT  # the same request again
    assert 1 == metrics


def big_and_small(sqlite_dsn: str, big: str, small: str) -> Any:
    """``big`` (no continuation of its own) falls back to ``small``, which accepts a prefill."""
    return make_config(
        sqlite_dsn,
        [
            upstream("big-u", [big], ["big"], retry=FAST, continuation="none"),
            upstream("small-u", [small], ["small"], retry=FAST, continuation="prefill"),
        ],
        models=[{"name": "big", "fallbacks": ["small"]}],
    )


async def test_a_broken_stream_continues_on_the_fallback_with_the_delivered_text_as_prefill(
    sqlite_dsn: str,
) -> None:
    async with (
        scripted(Step(events=40, cut=True), name="big") as big,
        scripted(OK, name="small") as small,
    ):
        async with serving(big_and_small(sqlite_dsn, big.url, small.url)) as gw:
            text = await stream(gw.v1, model="big")
    assert FULL == text
    assert (1, 1) == (big.count, small.count)
    sent = small.seen[0].body
    assert ("small", True, False) == (
        sent["model"],
        sent["continue_final_message"],
        sent["add_generation_prompt"],
    )
    assert [*CHAT, {"role": "assistant", "content": answer_text(WORDS[:40])}] == sent["messages"]


async def test_a_fallback_that_rejects_the_prefill_never_becomes_the_clients_error(
    sqlite_dsn: str,
) -> None:
    """The fallback answers 400 to the prefill: the client's stream ends with the first break
    (UPSTREAM_ERROR, the cut), not with the fallback's 400."""
    refuses = Step(status=400, error="assistant prefill is not supported")
    async with (
        scripted(Step(events=40, cut=True), name="big") as big,
        scripted(refuses, name="small") as small,
    ):
        async with serving(big_and_small(sqlite_dsn, big.url, small.url)) as gw:
            with pytest.raises(openai.APIError) as caught:
                await stream(gw.v1, model="big")
    assert "prefill" not in str(caught.value)
    assert "broke off" in str(caught.value)
    assert 1 == small.count


async def test_a_non_deterministic_stream_is_never_replayed_and_ends_with_an_error_event(
    sqlite_dsn: str,
) -> None:
    """No temperature 0, no seed: a replay would write another answer, so the stream ends with
    ``event: error`` after the 40 words — never a second, different text."""
    async with scripted(Step(events=40, cut=True), OK) as server:
        config = make_config(sqlite_dsn, [upstream("u", [server.url], ["m"], retry=FAST)])
        async with serving(config) as gw:
            with pytest.raises(openai.APIError, match="broke off"):
                await stream(gw.v1)
            failed = gw.gateway.metrics.continuations.labels("m", "failed")._value.get()
    assert 1 == server.count
    assert 1 == failed


async def test_a_replay_whose_text_departs_from_the_delivered_one_is_not_relayed(
    sqlite_dsn: str,
) -> None:
    """The replayed answer differs (the upstream is not deterministic after all): the client
    gets the error event, never the mixed text."""
    other = Step(words=tuple(w.upper() for w in WORDS))  # the replay says something else
    async with scripted(Step(events=40, cut=True), other) as first:
        config = make_config(sqlite_dsn, [upstream("u", [first.url], ["m"], retry=FAST)])
        async with serving(config) as gw:
            got: list[str] = []
            with pytest.raises(openai.APIError):
                await collect(gw.v1, got)
    assert answer_text(WORDS[:40]) == "".join(got)
    assert 1 + MAX_CONTINUATIONS == first.count  # bounded: each replay checked, none relayed


async def test_a_stream_that_ended_properly_is_relayed_untouched(sqlite_dsn: str) -> None:
    async with scripted(OK) as server:
        config = make_config(sqlite_dsn, [upstream("u", [server.url], ["m"])])
        async with serving(config) as gw:
            text = await stream(gw.v1, temperature=0)
    assert (FULL, 1) == (text, server.count)


async def test_a_crlf_framed_stream_is_relayed_whole_and_continued_like_any_other(
    sqlite_dsn: str,
) -> None:
    async with scripted(Step(crlf=True, events=40, cut=True), Step(crlf=True)) as server:
        config = make_config(sqlite_dsn, [upstream("u", [server.url], ["m"], retry=FAST)])
        async with serving(config) as gw:
            text = await stream(gw.v1, temperature=0)
    assert (FULL, 2) == (text, server.count)


async def test_a_stream_that_ends_without_done_after_its_finish_is_the_whole_answer(
    sqlite_dsn: str,
) -> None:
    """Every word and the finish chunk came, only ``data: [DONE]`` is missing: the answer is
    whole. The gateway writes the [DONE] and ends normally (counted), never an error."""
    async with scripted(Step(no_done=True)) as server:
        config = make_config(sqlite_dsn, [upstream("u", [server.url], ["m"], retry=FAST)])
        async with serving(config) as gw:
            text = await stream(gw.v1)
            repaired = gw.gateway.metrics.continuations.labels("m", "completed_missing_done")
    assert (FULL, 1) == (text, server.count)
    assert 1 == repaired._value.get()
