"""Retries on the same model (issue #13): what is retried, how patiently, and what never is.

Each rescue is pinned by what the scripted upstream saw: how many tries and the gaps between.
"""

from __future__ import annotations

from typing import Any

import aiohttp
import openai
import pytest
from multidict import CIMultiDict

from gpugate.config import RetryConfig
from gpugate.errors import ConfigError
from harness import make_config, serving, upstream
from scripted_upstream import OK, WORDS, Step, answer_text, scripted

CHAT = [{"role": "user", "content": "hi"}]
BODY = {"model": "m", "messages": CHAT}
FAST_RETRY = {"attempts": 3, "backoff_s": 0.05, "max_backoff_s": 0.2, "retry_after_max_s": 5}


async def post(
    http: aiohttp.ClientSession, url: str, body: dict[str, Any] | None = None
) -> tuple[int, CIMultiDict[str], Any]:
    async with http.post(url + "/chat/completions", json=body or BODY) as resp:
        return resp.status, CIMultiDict(resp.headers), await resp.json()


async def test_a_500_once_is_retried_and_the_client_gets_the_answer(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    async with scripted(Step(status=500), OK) as server:
        config = make_config(sqlite_dsn, [upstream("u", [server.url], ["m"], retry=FAST_RETRY)])
        async with serving(config) as gw:
            status, headers, body = await post(http, gw.v1)
            metrics = await (await http.get(gw.url + "/metrics")).text()
    assert 200 == status
    assert answer_text(WORDS) == body["choices"][0]["message"]["content"]
    assert ("2", "m") == (headers["X-Gateway-Attempts"], headers["X-Gateway-Model"])
    assert 2 == server.count
    assert 'gateway_upstream_attempts_total{outcome="5xx",upstream="u"} 1.0' in metrics
    assert 'gateway_upstream_attempts_total{outcome="ok",upstream="u"} 1.0' in metrics
    # a failed try is not a served request: one request, counted once, with its final code
    assert 'gateway_requests_total{class="interactive",code="200",model="m",upstream="u"} 1.0' in (
        metrics
    )
    assert 'code="500"' not in metrics


@pytest.mark.parametrize("status", [429, 500, 502, 503, 504])
async def test_each_retryable_status_is_tried_attempts_times_then_passed_through_unchanged(
    sqlite_dsn: str, http: aiohttp.ClientSession, status: int
) -> None:
    async with scripted(Step(status=status, error="always")) as server:
        config = make_config(sqlite_dsn, [upstream("u", [server.url], ["m"], retry=FAST_RETRY)])
        async with serving(config) as gw:
            got, headers, body = await post(http, gw.v1)
    assert (status, "always") == (got, body["error"]["message"])
    assert "3" == headers["X-Gateway-Attempts"]
    assert 3 == server.count


@pytest.mark.parametrize(("status", "code"), [(400, None), (401, None), (404, None), (422, None)])
async def test_other_4xx_are_answers_never_retried(
    sqlite_dsn: str, http: aiohttp.ClientSession, status: int, code: str | None
) -> None:
    async with scripted(Step(status=status, code=code)) as server:
        config = make_config(sqlite_dsn, [upstream("u", [server.url], ["m"], retry=FAST_RETRY)])
        async with serving(config) as gw:
            got, headers, _ = await post(http, gw.v1)
    assert (status, "1") == (got, headers["X-Gateway-Attempts"])
    assert 1 == server.count


async def test_a_429_with_retry_after_2_gets_at_most_two_attempts_in_the_first_1_5_s(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    """The upstream's Retry-After is honoured: the retry waits 2 s, not the short backoff."""
    async with scripted(Step(status=429, headers=(("Retry-After", "2"),)), OK) as server:
        config = make_config(sqlite_dsn, [upstream("u", [server.url], ["m"], retry=FAST_RETRY)])
        async with serving(config) as gw:
            status, headers, _ = await post(http, gw.v1)
    first = server.seen[0].at
    assert (200, "2") == (status, headers["X-Gateway-Attempts"])
    assert len([s for s in server.seen if s.at - first < 1.5]) <= 2
    assert server.seen[1].at - first >= 1.9


async def test_a_retry_after_longer_than_retry_after_max_s_is_not_waited_for(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    """Retry-After: 30 over a cap of 5 s: the 429 goes back to the client at once, with it."""
    async with scripted(Step(status=429, headers=(("Retry-After", "30"),))) as server:
        config = make_config(sqlite_dsn, [upstream("u", [server.url], ["m"], retry=FAST_RETRY)])
        async with serving(config) as gw:
            status, headers, _ = await post(http, gw.v1)
    assert (429, "30", "1") == (status, headers["Retry-After"], headers["X-Gateway-Attempts"])
    assert 1 == server.count


async def test_a_retry_goes_to_the_endpoint_not_tried_first_without_waiting(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    """Backoffs of 5 s: a retry that waited would show. The 503 endpoint is backed off after
    its answer, so later requests go to the healthy one first."""
    slow_retry = {**FAST_RETRY, "backoff_s": 5.0, "max_backoff_s": 5.0}
    async with scripted(Step(status=503), name="a") as a, scripted(OK, name="b") as b:
        config = make_config(sqlite_dsn, [upstream("u", [a.url, b.url], ["m"], retry=slow_retry)])
        async with serving(config) as gw:
            replies = [await post(http, gw.v1) for _ in range(6)]
    assert [200] * 6 == [status for status, _, _ in replies]
    assert a.count <= 1  # backed off after its 503: never picked again within 5 s
    assert 6 == b.count
    if a.count:
        assert b.seen[0].at - a.seen[0].at < 1.0


async def test_retries_stay_within_the_upstreams_retry_budget(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    """Always 500: each request would retry twice, but retries over 10 s stay within the
    budget's floor of 10 (20 % of 15 requests is less), so the dying upstream gets 25 tries,
    not 45."""
    async with scripted(Step(status=500)) as server:
        retry = {**FAST_RETRY, "backoff_s": 0.0, "max_backoff_s": 0.0}
        config = make_config(sqlite_dsn, [upstream("u", [server.url], ["m"], retry=retry)])
        async with serving(config) as gw:
            for _ in range(15):
                status, _, _ = await post(http, gw.v1)
                assert status in (500, 503)
    assert server.count <= 15 + 10


async def test_an_idempotency_key_request_is_kept_once_after_a_rescue(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    """The failed try is never stored: the key keeps the rescued answer, replayed as is."""
    async with scripted(Step(status=502), OK) as server:
        config = make_config(sqlite_dsn, [upstream("u", [server.url], ["m"], retry=FAST_RETRY)])
        async with serving(config) as gw:
            replies = []
            for _ in range(2):
                async with http.post(
                    gw.v1 + "/chat/completions", json=BODY, headers={"Idempotency-Key": "k1"}
                ) as resp:
                    replayed = resp.headers.get("Idempotent-Replayed")
                    replies.append((resp.status, replayed, await resp.read()))
    assert [200, 200] == [r[0] for r in replies]
    assert (None, "true") == (replies[0][1], replies[1][1])
    assert replies[0][2] == replies[1][2]
    assert 2 == server.count


async def test_the_openai_client_with_no_retries_of_its_own_gets_the_rescued_answer(
    sqlite_dsn: str,
) -> None:
    async with scripted(Step(status=503), Step(status=429), OK) as server:
        config = make_config(sqlite_dsn, [upstream("u", [server.url], ["m"], retry=FAST_RETRY)])
        async with serving(config) as gw:
            client = openai.AsyncOpenAI(base_url=gw.v1, api_key="unused", max_retries=0)
            answer = await client.chat.completions.create(model="m", messages=CHAT)  # type: ignore[arg-type]
            await client.close()
    assert answer_text(WORDS) == answer.choices[0].message.content
    assert 3 == server.count


def test_retry_defaults_and_limits_are_checked() -> None:
    assert (3, 0.5, 4.0, 10.0) == tuple(RetryConfig().model_dump().values())
    with pytest.raises(ConfigError, match=r"upstreams\[0\]\.retry\.attempts"):
        make_config("sqlite:///x.db", [upstream("u", ["http://h"], ["m"], retry={"attempts": 0})])
    with pytest.raises(ConfigError, match="max_backoff_s must be at least backoff_s"):
        make_config(
            "sqlite:///x.db",
            [upstream("u", ["http://h"], ["m"], retry={"backoff_s": 5, "max_backoff_s": 1})],
        )


async def test_a_fast_failing_upstream_does_not_attract_all_the_traffic(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    """#14.2: an endpoint answering 429 in 1 ms against a healthy peer 5 ms slower. 429 is a
    load signal: that endpoint is backed off and its fast errors teach no latency, so the peer
    gets the traffic (no retries here: the picker alone is under test)."""
    once = {"attempts": 1}
    async with (
        scripted(Step(status=429), name="fast") as fast,
        scripted(Step(delay_s=0.005), name="peer") as peer,
    ):
        config = make_config(sqlite_dsn, [upstream("u", [fast.url, peer.url], ["m"], retry=once)])
        async with serving(config) as gw:
            statuses = [(await post(http, gw.v1))[0] for _ in range(60)]
    assert statuses.count(200) >= 55
    assert fast.count <= 5
    assert statuses.count(200) == peer.count
