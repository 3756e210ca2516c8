"""Issue #13, Done-when 1: each of the sixteen faults, through the real ``openai`` client, with the
primary ``m`` and one fallback ``fb`` configured. The client gets the complete answer (for the
content-policy 400: that error unchanged) within the upstream's deadlines, with bounded attempts,
no hammering, and the gateway is healthy afterwards; every rescue is pinned by what the fake
providers saw."""

from __future__ import annotations

import json

import pytest

from gpugate.fleet.faults import ContentStyle, Fault, refusal
from resilience.rig import (
    ATTEMPTS,
    CUT_AT,
    DEADLINE_S,
    FALLBACK,
    PRIMARY,
    SLACK_S,
    WAIT_PER_TRY_S,
    Outcome,
    Rig,
    attempts_within,
    complete,
    continued_on_fallback,
    rescued_texts,
    running_rig,
)

pytestmark = pytest.mark.timeout(120)


def assert_answered_by_fallback(rig: Rig, prompt: str, out: Outcome) -> None:
    assert out.answered, out
    assert complete(FALLBACK, prompt) == out.text
    assert FALLBACK == out.model
    primary, fallback = rig.seen(prompt)
    assert 1 <= len(primary) <= ATTEMPTS
    assert 1 == len(fallback)
    assert out.attempts == len(primary) + len(fallback)


# -- 1, 2: 429 with Retry-After (seconds, HTTP date) and without -------------------------------


@pytest.mark.parametrize("as_date", [False, True], ids=["seconds", "http-date"])
async def test_a_429_with_retry_after_2_gets_at_most_2_attempts_in_1_5_s_and_is_answered(
    rig: Rig, stream: bool, as_date: bool
) -> None:
    rig.primary.inject("status", status=429, retry_after_s=2, retry_after_date=as_date)
    prompt = rig.prompt("rate limited, told when")

    out = await rig.ask(prompt, stream=stream)

    assert_answered_by_fallback(rig, prompt, out)
    primary, _ = rig.seen(prompt)
    assert attempts_within(primary, 1.5) <= 2
    assert out.elapsed_s <= ATTEMPTS * WAIT_PER_TRY_S + SLACK_S
    await rig.healthy()


async def test_a_429_without_retry_after_falls_back_after_bounded_backed_off_tries(
    rig: Rig, stream: bool
) -> None:
    rig.primary.inject("status", status=429)
    prompt = rig.prompt("rate limited")

    out = await rig.ask(prompt, stream=stream)

    assert_answered_by_fallback(rig, prompt, out)
    assert out.elapsed_s <= ATTEMPTS * WAIT_PER_TRY_S + SLACK_S
    await rig.healthy()


# -- 3, 4: 500 once, 503 persistent ------------------------------------------------------------


async def test_a_500_once_is_retried_on_the_primary_which_answers(rig: Rig, stream: bool) -> None:
    rig.primary.inject("status", status=500, count=1)
    prompt = rig.prompt("500 once")

    out = await rig.ask(prompt, stream=stream)

    assert out.answered, out
    assert complete(PRIMARY, prompt) == out.text
    assert PRIMARY == out.model
    primary, fallback = rig.seen(prompt)
    assert [(1, 500), (2, 200)] == [(seen["attempt"], seen["status"]) for seen in primary]
    assert [] == fallback
    assert 2 == out.attempts
    await rig.healthy()


async def test_a_persistent_503_falls_back_after_bounded_tries(rig: Rig, stream: bool) -> None:
    rig.primary.inject("status", status=503)
    prompt = rig.prompt("503 persistent")

    out = await rig.ask(prompt, stream=stream)

    assert_answered_by_fallback(rig, prompt, out)
    assert all(seen["status"] == 503 for seen in rig.seen(prompt)[0])
    assert out.elapsed_s <= ATTEMPTS * WAIT_PER_TRY_S + SLACK_S
    await rig.healthy()


# -- 5, 6, 7: a reset before headers, no response, a slow first token --------------------------


async def test_a_reset_before_headers_is_retried_then_falls_back(rig: Rig, stream: bool) -> None:
    rig.primary.inject("reset")
    prompt = rig.prompt("reset before headers")

    out = await rig.ask(prompt, stream=stream)

    assert_answered_by_fallback(rig, prompt, out)
    assert all(seen["fault"] == "reset" for seen in rig.seen(prompt)[0])
    await rig.healthy()


async def test_a_reset_once_before_headers_is_retried_on_the_primary(
    rig: Rig, stream: bool
) -> None:
    rig.primary.inject("reset", count=1)
    prompt = rig.prompt("reset once")

    out = await rig.ask(prompt, stream=stream)

    assert out.answered, out
    assert complete(PRIMARY, prompt) == out.text
    assert [1, 2] == [seen["attempt"] for seen in rig.seen(prompt)[0]]
    await rig.healthy()


async def test_no_response_is_given_up_at_the_deadline_and_answered_by_the_fallback(
    rig: Rig, stream: bool
) -> None:
    rig.primary.inject("silent")
    prompt = rig.prompt("silent")

    out = await rig.ask(prompt, stream=stream)

    assert_answered_by_fallback(rig, prompt, out)
    assert DEADLINE_S <= out.elapsed_s <= ATTEMPTS * DEADLINE_S + SLACK_S
    await rig.healthy()


async def test_a_slow_first_token_is_given_up_at_the_deadline_and_answered_by_the_fallback(
    rig: Rig, stream: bool
) -> None:
    rig.primary.inject("slow_first_token", seconds=30)
    prompt = rig.prompt("slow first token")

    out = await rig.ask(prompt, stream=stream)

    assert_answered_by_fallback(rig, prompt, out)
    assert DEADLINE_S <= out.elapsed_s <= ATTEMPTS * DEADLINE_S + SLACK_S
    await rig.healthy()


# -- 8-11: a stream cut after 40 of 60 tokens, a stall, a malformed chunk, no [DONE] ----------


def assert_rescued_mid_stream(rig: Rig, prompt: str, text: str) -> None:
    """The whole answer, never duplicated or garbled: the primary's replayed (output held until
    it passed the 40 tokens delivered) or continued on the fallback after a prefill of them."""
    assert text in rescued_texts(prompt), text
    primary, fallback = rig.seen(prompt)
    if text == continued_on_fallback(prompt):
        delivered = " ".join(complete(PRIMARY, prompt).split()[:CUT_AT])
        assert [delivered] == [seen["prefill"] for seen in fallback]
        assert 1 == len(primary)
    else:
        assert 2 == len(primary)
        assert [] == fallback


@pytest.mark.parametrize(
    "fault",
    [
        Fault(kind="cut", after=CUT_AT, count=1),
        Fault(kind="stall", after=CUT_AT, seconds=30, count=1),
        Fault(kind="malformed", after=CUT_AT, count=1),
        Fault(kind="no_done", after=CUT_AT, count=1),
    ],
    ids=["cut", "stall", "malformed", "closed-without-done"],
)
async def test_a_stream_broken_after_40_of_60_tokens_is_continued_to_its_end(
    rig: Rig, fault: Fault
) -> None:
    rig.primary.arm(fault)
    prompt = rig.prompt(f"broken stream {fault.kind}")

    out = await rig.ask(prompt, stream=True)

    assert out.answered, out
    assert_rescued_mid_stream(rig, prompt, out.text)
    stall_bound = DEADLINE_S if fault.kind == "stall" else 0
    assert out.elapsed_s <= stall_bound + DEADLINE_S + SLACK_S
    await rig.healthy()


async def test_a_stream_that_ends_without_done_after_its_finish_is_the_whole_answer(
    rig: Rig,
) -> None:
    rig.primary.inject("no_done", count=1)
    prompt = rig.prompt("no done after finish")

    out = await rig.ask(prompt, stream=True)

    assert out.answered, out
    assert complete(PRIMARY, prompt) == out.text
    assert len(rig.seen(prompt)[0]) <= 2
    await rig.healthy()


async def test_a_non_streamed_request_whose_server_died_before_answering_is_tried_again(
    rig: Rig,
) -> None:
    rig.primary.inject("cut", after=CUT_AT, count=1)
    prompt = rig.prompt("non-streamed cut")

    out = await rig.ask(prompt, stream=False)

    assert out.answered, out
    assert complete(PRIMARY, prompt) == out.text
    assert [1, 2] == [seen["attempt"] for seen in rig.seen(prompt)[0]]
    assert out.elapsed_s <= SLACK_S
    await rig.healthy()


async def test_a_non_streamed_request_that_stalls_past_its_deadline_is_answered_elsewhere(
    rig: Rig,
) -> None:
    rig.primary.inject("stall", after=CUT_AT, seconds=30, count=1)
    prompt = rig.prompt("non-streamed stall")

    out = await rig.ask(prompt, stream=False)

    assert out.answered, out
    # tried again on the primary, or given to the fallback: either is a whole answer
    assert out.text in {complete(PRIMARY, prompt), complete(FALLBACK, prompt)}
    primary, fallback = rig.seen(prompt)
    assert len(primary) + len(fallback) == 2
    assert DEADLINE_S <= out.elapsed_s <= DEADLINE_S + SLACK_S
    await rig.healthy()


# -- 12, 13: context_length_exceeded, content policy --------------------------------------------


async def test_context_length_exceeded_goes_to_the_context_fallback_without_a_retry(
    rig: Rig, stream: bool
) -> None:
    rig.primary.inject("context_length")
    prompt = rig.prompt("too long")

    out = await rig.ask(prompt, stream=stream)

    assert_answered_by_fallback(rig, prompt, out)
    assert ["context_length"] == [seen["fault"] for seen in rig.seen(prompt)[0]]
    await rig.healthy()


@pytest.mark.parametrize("style", ["openai", "azure"])
async def test_a_content_policy_refusal_is_returned_unchanged_and_never_routed_around(
    rig: Rig, stream: bool, style: ContentStyle
) -> None:
    rig.primary.inject("content_filter", style=style)
    prompt = rig.prompt("refused")

    out = await rig.ask(prompt, stream=stream)

    given = refusal(Fault(kind="content_filter", style=style), server="", prompt_tokens=0)
    assert given is not None
    assert 400 == out.status
    assert json.loads(given.body)["error"] == out.error
    primary, fallback = rig.seen(prompt)
    assert (1, 0) == (len(primary), len(fallback))
    await rig.healthy()


# -- 14: a fallback that rejects an assistant prefill ------------------------------------------


async def test_a_fallback_rejecting_the_prefill_does_not_become_the_story(
    sqlite_dsn: str,
) -> None:
    rejects = (Fault(kind="reject_prefill"),)
    async with running_rig(sqlite_dsn, with_fallback=True, fallback_faults=rejects) as rig:
        rig.primary.inject("cut", after=CUT_AT, count=1)
        prompt = rig.prompt("fallback rejects prefill")

        out = await rig.ask(prompt, stream=True)

        assert out.answered, out  # not the fallback's 400
        assert complete(PRIMARY, prompt) == out.text
        primary, fallback = rig.seen(prompt)
        assert 2 == len(primary)
        assert all(seen["status"] == 400 for seen in fallback)
        assert len(fallback) <= 1
        # the rule stays armed: the fallback keeps refusing prefills, and healthy() clears it
        await rig.healthy()


# -- 15: a primary down, then back --------------------------------------------------------------


async def test_a_primary_that_is_down_is_stood_in_for_and_gets_traffic_back_when_it_returns(
    rig: Rig, stream: bool
) -> None:
    await rig.primary.down_for(4)
    prompt = rig.prompt("primary down")

    out = await rig.ask(prompt, stream=stream)

    assert out.answered, out
    assert complete(FALLBACK, prompt) == out.text
    assert FALLBACK == out.model
    assert out.elapsed_s <= SLACK_S
    await rig.healthy(within_s=4 + 10)


# -- 16: fail-over accounting -------------------------------------------------------------------


async def test_failed_attempts_are_counted_as_attempts_and_the_fallback_as_the_one_served(
    rig: Rig,
) -> None:
    rig.primary.inject("status", status=503)
    prompt = rig.prompt("accounting")

    out = await rig.ask(prompt, stream=False)
    metrics = await rig.metrics()

    assert_answered_by_fallback(rig, prompt, out)
    primary, _ = rig.seen(prompt)

    def total(name: str, **labels: str) -> float:
        return sum(
            value
            for (sample, have), value in metrics.items()
            if sample == name and set(labels.items()) <= have
        )

    attempts = "gateway_upstream_attempts_total"
    served_outcomes = {
        dict(labels)["outcome"]
        for (sample, labels), value in metrics.items()
        if sample == attempts and ("upstream", "fallback") in labels and value > 0
    }
    assert len(primary) == total(attempts, upstream="primary")
    assert 1 == total(attempts, upstream="fallback")
    assert len(served_outcomes) == 1  # the fallback's one try, the one that served
    (served_as,) = served_outcomes
    assert 0 == total(attempts, upstream="primary", outcome=served_as)
    assert 1 == total("gateway_fallbacks_total", model=PRIMARY, to=FALLBACK)
    served = "gateway_requests_total"
    assert 0 == total(served, upstream="primary", code="200")
    assert 1 == total(served, upstream="fallback", code="200")
