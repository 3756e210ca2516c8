"""Issue #13, Done-when 3: a primary down for 60 s, then healthy; twenty requests 4 s apart are all
answered — during the outage by the fallback, without first paying for the dead primary — and the
traffic is back on the primary within 10 s of its recovery."""

from __future__ import annotations

import asyncio
import time

import pytest

from resilience.rig import FALLBACK, PRIMARY, SLACK_S, Rig, complete

OUTAGE_S = 60.0
REQUESTS = 20
APART_S = 4.0
BACK_WITHIN_S = 10.0


@pytest.mark.slow
@pytest.mark.timeout(240)
async def test_twenty_requests_through_a_60_s_outage_are_all_answered_and_traffic_returns(
    rig: Rig,
) -> None:
    await rig.primary.down_for(OUTAGE_S)
    down_at = time.monotonic()
    answered_by: list[tuple[float, str | None, float]] = []
    for i in range(REQUESTS):
        await asyncio.sleep(max(0.0, down_at + i * APART_S - time.monotonic()))
        prompt = rig.prompt(f"outage request {i}")
        sent = time.monotonic() - down_at
        out = await rig.ask(prompt, stream=i % 2 == 1)

        assert out.answered, (i, out)
        assert out.model in (PRIMARY, FALLBACK)
        assert complete(out.model, prompt) == out.text
        answered_by.append((sent, out.model, out.elapsed_s))

    during = [(at, model, took) for at, model, took in answered_by if at < OUTAGE_S]
    assert all(model == FALLBACK for _, model, _ in during), during
    assert all(took <= SLACK_S for _, _, took in during), during
    back = [model for at, model, _ in answered_by if at >= OUTAGE_S + BACK_WITHIN_S]
    assert back, "no request after the recovery window"
    assert all(model == PRIMARY for model in back), answered_by
