"""Limits that hold across replicas (issue #16, Done-when 2, the CI-length run; bench/keys.py
runs 2 minutes): two ``gpugate serve`` on one PostgreSQL, one key, the load split across both.

The accuracy claim is the same as the bench's: in every UTC minute what the replicas leased
from the store stays within the key's limits (each lease is one locked decision on the shared
store) and what clients were served stays within what was leased (a request's estimate is never
below what it uses here) — short of the limit by at most a slice per replica; and a daily
budget under 50 concurrent requests is never passed by more than one request's worth.
"""

from __future__ import annotations

from pathlib import Path

import aiohttp
from keys_rig import counters, create_key, drive, prompt_of, replicas

from gpugate.fleet import ModelServer

RPM, TPM = 600, 60_000


async def test_one_key_s_rpm_and_tpm_hold_for_the_sum_of_two_replicas(
    jobs_schema: str, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    async with ModelServer(["m"], name="u") as server:
        async with replicas(tmp_path, jobs_schema, server.url, http) as (a, b):
            key = await create_key(
                http, a.url, limits={"requests_per_min": RPM, "tokens_per_min": TPM}
            )
            # 100 words a prompt: ~116 tokens a request, so the tokens bind before the requests
            tally = await drive(
                http, [a.url, b.url], key["key"], seconds=12, workers=16, body=prompt_of(100)
            )
        spans = await counters(jobs_schema, key["id"])
    minutes = {span: n for span, n in spans.items() if span.startswith("m:")}
    assert minutes
    assert all(requests <= RPM for requests, _, _ in minutes.values()), minutes
    assert all(tokens <= TPM for _, tokens, _ in minutes.values()), minutes
    leased_requests = sum(requests for requests, _, _ in minutes.values())
    leased_tokens = sum(tokens for _, tokens, _ in minutes.values())
    assert tally.accepted <= leased_requests
    assert tally.tokens <= leased_tokens
    assert len(tally.by_replica) == 2  # both replicas served the key
    assert tally.codes["TOKEN_LIMITED"] + tally.codes["RATE_LIMITED"] > 0  # the limit was hit


async def test_a_daily_budget_under_50_concurrent_requests_is_never_passed_by_one_request(
    jobs_schema: str, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    price = (
        "models:\n  - name: m\n    price: {prompt_per_1k_cents: 10, completion_per_1k_cents: 20}\n"
    )
    budget = 20.0  # cents: ~1.3 cents a request (100 prompt + 16 completion words)
    async with ModelServer(["m"], name="u") as server:
        async with replicas(tmp_path, jobs_schema, server.url, http, models=price) as (a, b):
            key = await create_key(http, a.url, limits={"daily_cents": budget})
            tally = await drive(
                http, [a.url, b.url], key["key"], seconds=6, workers=50, body=prompt_of(100)
            )
        spans = await counters(jobs_schema, key["id"])
    (leased,) = [cents for span, (_, _, cents) in spans.items() if span.startswith("d:")]
    spent = (tally.prompt * 10 + tally.completion * 20) / 1000  # what was served, priced
    one_request = (100 * 10 + 16 * 20) / 1000
    assert spent <= leased <= budget
    assert spent <= budget + one_request
    assert spent > budget - 4 * one_request  # and it was spent, not refused early
    assert tally.codes["BUDGET_EXCEEDED"] > 0
