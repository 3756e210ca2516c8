"""Model fallbacks (issue #13): ``models: [{name, fallbacks, context_fallbacks}]``."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import pytest
from multidict import CIMultiDict

from gpugate.config import fallback_warnings
from gpugate.errors import ConfigError
from harness import make_config, serving, upstream
from scripted_upstream import OK, WORDS, Step, answer_text, scripted

CHAT = [{"role": "user", "content": "hi"}]
BODY = {"model": "big", "messages": CHAT}
FAST = {"attempts": 2, "backoff_s": 0.01, "max_backoff_s": 0.05, "retry_after_max_s": 5}
MODELS = [{"name": "big", "fallbacks": ["small"], "context_fallbacks": ["long"]}]
PLAIN = [{"name": "big", "fallbacks": ["small"]}]


async def post(
    http: aiohttp.ClientSession, url: str, body: dict[str, Any] | None = None
) -> tuple[int, CIMultiDict[str], Any]:
    async with http.post(url + "/chat/completions", json=body or BODY) as resp:
        return resp.status, CIMultiDict(resp.headers), await resp.json()


def fleet(sqlite_dsn: str, big: str, small: str, long: str | None = None, **extra: Any) -> Any:
    upstreams = [
        upstream("big-u", [big], ["big"], retry=FAST),
        upstream("small-u", [small], ["small"], retry=FAST, **extra),
    ]
    if long is not None:
        upstreams.append(upstream("long-u", [long], ["long"], retry=FAST))
    return make_config(sqlite_dsn, upstreams, models=PLAIN if long is None else MODELS)


async def test_a_persistent_503_goes_to_the_fallback_model_with_its_own_answer(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    async with scripted(Step(status=503), name="big") as big, scripted(OK, name="small") as small:
        async with serving(fleet(sqlite_dsn, big.url, small.url)) as gw:
            status, headers, body = await post(http, gw.v1)
            metrics = await (await http.get(gw.url + "/metrics")).text()
    assert 200 == status
    assert ("small", "3") == (headers["X-Gateway-Model"], headers["X-Gateway-Attempts"])
    assert "small" == body["model"]  # relayed as the fallback answered it
    assert answer_text(WORDS) == body["choices"][0]["message"]["content"]
    assert (2, 1) == (big.count, small.count)
    assert "small" == small.seen[0].body["model"]  # the body's model rewritten
    assert CHAT == small.seen[0].body["messages"]
    assert 'gateway_fallbacks_total{model="big",reason="failed",to="small"} 1.0' in metrics


async def test_during_an_outage_requests_go_straight_to_the_fallback_without_paying_for_the_primary(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    """After the primary's 503s its endpoint is backed off: the next requests skip it."""
    async with scripted(Step(status=503), name="big") as big, scripted(OK, name="small") as small:
        async with serving(fleet(sqlite_dsn, big.url, small.url)) as gw:
            first = await post(http, gw.v1)
            after = [await post(http, gw.v1) for _ in range(3)]
    assert ("small", "3") == (first[1]["X-Gateway-Model"], first[1]["X-Gateway-Attempts"])
    assert [("small", "1")] * 3 == [
        (h["X-Gateway-Model"], h["X-Gateway-Attempts"]) for _, h, _ in after
    ]
    assert 2 == big.count


async def test_a_primary_out_of_rotation_sends_interactive_traffic_to_the_fallback_at_once(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    async with scripted(OK, name="big") as big, scripted(OK, name="small") as small:
        async with serving(fleet(sqlite_dsn, big.url, small.url)) as gw:
            gw.gateway.registry.guard = lambda uid: (
                "GPU 0 faulted: XID 79" if uid == "big-u" else None
            )
            status, headers, _ = await post(http, gw.v1)
            gw.gateway.registry.guard = lambda uid: "drained"
            refused, _, error = await post(http, gw.v1)
    assert (200, "small", "1") == (
        status,
        headers["X-Gateway-Model"],
        headers["X-Gateway-Attempts"],
    )
    assert 0 == big.count
    assert (503, "NO_HEALTHY_UPSTREAM") == (refused, error["error"]["code"])


async def test_context_length_exceeded_goes_to_the_context_fallback_never_the_plain_one(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    too_long = Step(status=400, code="context_length_exceeded", error="maximum context length")
    async with (
        scripted(too_long, name="big") as big,
        scripted(OK, name="small") as small,
        scripted(OK, name="long") as long,
    ):
        async with serving(fleet(sqlite_dsn, big.url, small.url, long.url)) as gw:
            status, headers, body = await post(http, gw.v1)
    assert (200, "long") == (status, headers["X-Gateway-Model"])
    assert "long" == body["model"]
    assert (1, 0, 1) == (big.count, small.count, long.count)


async def test_a_content_policy_400_is_returned_unchanged_and_never_routed_around(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    refusal = Step(
        status=400, code="content_filter", error="the prompt violates the content policy"
    )
    async with (
        scripted(refusal, name="big") as big,
        scripted(OK, name="small") as small,
        scripted(OK, name="long") as long,
    ):
        async with serving(fleet(sqlite_dsn, big.url, small.url, long.url)) as gw:
            status, headers, body = await post(http, gw.v1)
    assert (400, "big", "1") == (status, headers["X-Gateway-Model"], headers["X-Gateway-Attempts"])
    assert ("content_filter", "the prompt violates the content policy") == (
        body["error"]["code"],
        body["error"]["message"],
    )
    assert (1, 0, 0) == (big.count, small.count, long.count)


async def test_a_fallback_never_lands_on_an_external_upstream(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    """The primary's users sent their data to an in-house model: a fallback served only by a
    third-party API is skipped, and the primary's own failure is what the client gets."""
    async with scripted(Step(status=503), name="big") as big, scripted(OK, name="small") as small:
        async with serving(fleet(sqlite_dsn, big.url, small.url, external=True)) as gw:
            status, headers, _ = await post(http, gw.v1)
    assert (503, "big") == (status, headers["X-Gateway-Model"])
    assert 0 == small.count


async def test_batch_is_still_shed_and_never_rescued_by_a_fallback(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    """A shed is the gateway protecting its GPUs: falling back would defeat it."""
    async with scripted(OK, name="big") as big, scripted(OK, name="small") as small:
        async with serving(fleet(sqlite_dsn, big.url, small.url)) as gw:

            class Everything:
                def saturated(self, _: str) -> bool:
                    return True

            from gpugate.services.shed import ShedGate

            gw.gateway.proxy.gate = ShedGate(Everything(), gw.gateway.metrics, retry_after_s=5)  # type: ignore[arg-type]
            async with http.post(
                gw.v1 + "/chat/completions", json=BODY, headers={"X-Request-Class": "batch"}
            ) as resp:
                body = await resp.json()
    assert (429, "GPU_SATURATED") == (resp.status, body["error"]["code"])
    assert (0, 0) == (big.count, small.count)


def test_a_fallback_naming_the_model_itself_is_a_config_error_an_unserved_one_a_warning() -> None:
    ups = [upstream("a", ["http://h"], ["big"]), upstream("b", ["http://i"], ["small"])]
    models = [{"name": "big", "fallbacks": ["nope", "big"], "context_fallbacks": ["small"]}]
    with pytest.raises(ConfigError) as caught:
        make_config("sqlite:///x.db", ups, models=models)
    models[0]["fallbacks"] = ["nope"]
    warned = [str(p) for p in fallback_warnings(make_config("sqlite:///x.db", ups, models=models))]
    assert ["models[0].fallbacks[1]: 'big' is the model itself"] == [
        str(p) for p in caught.value.problems
    ]
    skipped = "no upstream serves model 'nope' (served: big, small); the walk skips it"
    assert [f"models[0].fallbacks[0]: {skipped}"] == warned


def falling_back_to(sqlite_dsn: str, big: str, small: str, fallbacks: list[str]) -> Any:
    upstreams = [
        upstream("big-u", [big], ["big"], retry=FAST),
        upstream("small-u", [small], ["small"], retry=FAST),
    ]
    return make_config(sqlite_dsn, upstreams, models=[{"name": "big", "fallbacks": fallbacks}])


async def test_the_walk_passes_over_a_fallback_no_upstream_serves(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    async with scripted(Step(status=503), name="big") as big, scripted(OK, name="small") as small:
        async with serving(
            falling_back_to(sqlite_dsn, big.url, small.url, ["nope", "small"])
        ) as gw:
            status, headers, _ = await post(http, gw.v1)
    assert (200, "small") == (status, headers["X-Gateway-Model"])


async def test_when_only_an_unserved_fallback_is_left_the_client_gets_the_primarys_failure(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    async with scripted(Step(status=503), name="big") as big, scripted(OK, name="small") as small:
        async with serving(falling_back_to(sqlite_dsn, big.url, small.url, ["nope"])) as gw:
            status, _, _ = await post(http, gw.v1)
    assert (503, 2, 0) == (status, big.count, small.count)  # the primary's 503, not a 404


async def test_a_primary_down_then_healthy_every_request_answered_and_traffic_back_within_10_s(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    """Issue #13 Done-when 3, compressed: the primary is down 6 s, then healthy; a request every
    0.4 s for 14 s. All answered; during the outage by the fallback (after the primary backed
    off, without paying for it); the primary serves again within 10 s of its recovery."""
    async with scripted(OK, name="big") as big, scripted(OK, name="small") as small:
        async with serving(fleet(sqlite_dsn, big.url, small.url)) as gw:
            started = time.monotonic()
            big.down_until = started + 6.0
            served: list[tuple[float, int, str]] = []
            while time.monotonic() - started < 14.0:
                status, headers, _ = await post(http, gw.v1)
                served.append((time.monotonic() - started, status, headers["X-Gateway-Model"]))
                await asyncio.sleep(0.4)
    assert all(status == 200 for _, status, _ in served)
    back = [at for at, _, model in served if model == "big" and at > 6.0]
    assert back
    assert back[0] < 6.0 + 10.0
    during = [s for s in big.seen if s.at - started < 6.0]
    outage_requests = [1 for at, _, _ in served if at < 6.0]
    assert len(during) < len(outage_requests)  # most went straight to the fallback
