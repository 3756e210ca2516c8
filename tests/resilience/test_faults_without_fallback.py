"""Issue #13, Done-when 2: with no fallback configured, each of the sixteen faults ends in either
the complete answer or a bounded, clean error — never a hang past the deadlines, never a
truncated success, never garbled text."""

from __future__ import annotations

import pytest

from gpugate.fleet.faults import Fault
from resilience.rig import (
    ATTEMPTS,
    CUT_AT,
    DEADLINE_S,
    PRIMARY,
    SLACK_S,
    WAIT_PER_TRY_S,
    Outcome,
    Rig,
    complete,
)

pytestmark = pytest.mark.timeout(120)

FAULTS = {
    "429 Retry-After 2 s": Fault(kind="status", status=429, retry_after_s=2),
    "429 Retry-After date": Fault(
        kind="status", status=429, retry_after_s=2, retry_after_date=True
    ),
    "429 without Retry-After": Fault(kind="status", status=429),
    "500 once": Fault(kind="status", status=500, count=1),
    "503 persistent": Fault(kind="status", status=503),
    "reset before headers": Fault(kind="reset"),
    "no response": Fault(kind="silent"),
    "slow first token": Fault(kind="slow_first_token", seconds=30),
    "cut after 40 of 60": Fault(kind="cut", after=CUT_AT, count=1),
    "stall 30 s mid-way": Fault(kind="stall", after=CUT_AT, seconds=30, count=1),
    "malformed chunk": Fault(kind="malformed", after=CUT_AT, count=1, stream=True),
    "closed without [DONE]": Fault(kind="no_done", after=CUT_AT, count=1, stream=True),
    "no [DONE] after the finish": Fault(kind="no_done", count=1, stream=True),
    "context_length_exceeded": Fault(kind="context_length"),
    "content filter": Fault(kind="content_filter"),
    "cut, persistent": Fault(kind="cut", after=CUT_AT),
}
"""The sixteen faults as rules on the primary (a fallback rejecting a prefill needs a fallback;
its no-fallback counterpart is a stream cut on every try; a primary down is the outage test's).
The stream-only faults (a malformed chunk, no ``[DONE]``) leave a non-streamed request alone:
there it is the plain answer."""

BOUND_S = ATTEMPTS * max(WAIT_PER_TRY_S, DEADLINE_S) + DEADLINE_S + SLACK_S


def assert_complete_or_clean_error(out: Outcome, prompt: str) -> None:
    whole = complete(PRIMARY, prompt)
    assert not out.not_json, f"not a clean error: {out.error}"
    if out.error is None:
        assert out.answered, f"a success that did not finish: {out}"
        assert whole == out.text, "a success with a truncated or garbled answer"
        return
    assert whole.startswith(out.text), f"garbled text before the error: {out.text!r}"
    if out.status is not None:  # refused before any byte: OpenAI's error shape with a code
        assert isinstance(out.error, dict), out
        assert out.error.get("message"), out
        assert out.error.get("code") or out.error.get("type"), out


@pytest.mark.parametrize("name", list(FAULTS))
async def test_without_a_fallback_each_fault_ends_complete_or_in_a_clean_error_in_time(
    alone: Rig, stream: bool, name: str
) -> None:
    fault = FAULTS[name]
    alone.primary.arm(fault)
    prompt = alone.prompt(name)

    out = await alone.ask(prompt, stream=stream)

    assert_complete_or_clean_error(out, prompt)
    assert out.elapsed_s <= BOUND_S, out
    primary, fallback = alone.seen(prompt)
    assert 1 <= len(primary) <= ATTEMPTS + 1  # one more: a continuation's replay
    assert [] == fallback
    await alone.healthy()


async def test_without_a_fallback_a_content_policy_refusal_is_the_providers_error(
    alone: Rig, stream: bool
) -> None:
    alone.primary.inject("content_filter", style="azure")
    prompt = alone.prompt("refused alone")

    out = await alone.ask(prompt, stream=stream)

    assert 400 == out.status
    assert isinstance(out.error, dict)
    assert "content_filter" == out.error["code"]
    assert 1 == len(alone.seen(prompt)[0])
