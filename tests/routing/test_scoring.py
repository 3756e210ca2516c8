"""The scorer: load from the engines (or outstanding counts when stale), prefix, session and LoRA
affinity, the load-balance override, batch and saturated GPUs; and the Router around it."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import pytest

from gpugate.config import RoutingConfig, UpstreamConfig
from gpugate.config.models import ModelConfig
from gpugate.core.engine_metrics import EngineReading, EngineSignal
from gpugate.core.picking import EndpointState
from gpugate.core.scoring import (
    Facts,
    Reason,
    Router,
    choose,
    load_of,
    policy_table,
    session_key,
)

CFG = RoutingConfig()
SYSTEM = "You are a careful assistant. " * 40  # ~1,200 characters: a shared system prompt


def rng() -> random.Random:
    return random.Random(7)


def signal(running: float, waiting: float, kv: float = 0.0, *, loras: frozenset[str] = frozenset(),
           then: int = 0) -> EngineSignal:  # fmt: skip
    reading = EngineReading("vllm", running, waiting, kv, None, lora_running=loras)
    return EngineSignal(reading, then, 0.5)


def endpoints(n: int) -> list[EndpointState]:
    return [EndpointState("u", f"http://e{i}") for i in range(n)]


def chat(system: str, user: str, **extra: Any) -> dict[str, Any]:
    return {
        "model": "m",
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
        **extra,
    }


def router(
    policy: str = "prefix_affinity", signals: dict[str, EngineSignal] | None = None, **cfg: Any
) -> Router:
    routing = RoutingConfig(policy=policy, **cfg)  # type: ignore[arg-type]
    table = signals or {}
    return Router(lambda _m, _u: routing, signal=lambda _up, url, _now: table.get(url))


def send(
    r: Router,
    eps: list[EndpointState],
    doc: dict[str, Any],
    seed: int = 7,
    **route: Any,
) -> EndpointState:
    planned = r.route("m", None, doc, **route)
    chosen, _ = r.pick(planned, eps, random.Random(seed), 0.0)
    r.sent(planned, chosen)
    return chosen


# -- load ------------------------------------------------------------------------------------


def test_load_is_outstanding_plus_what_only_the_engine_knows() -> None:
    """Other clients' requests (6 on the engine, 3 of them ours when read), one extra per
    waiting request, and KV pressure above 90 %."""
    fresh = signal(running=4, waiting=2, kv=0.95, then=3)

    assert pytest.approx(5 + (6 - 3) + 1.0 * 2 + 2.0 * 0.5) == load_of(5, fresh, CFG)


def test_a_cache_below_ninety_percent_full_adds_no_load() -> None:
    assert 2.0 == load_of(2, signal(running=2, waiting=0, kv=0.85, then=2), CFG)


def test_without_a_fresh_reading_load_is_gpugates_outstanding_count() -> None:
    assert 3.0 == load_of(3, None, CFG)


def test_the_least_loaded_endpoint_wins_when_nothing_else_differs() -> None:
    choice = choose([Facts(load=5), Facts(load=1), Facts(load=3)], CFG, rng())

    assert (1, Reason.LOAD) == (choice.index, choice.reason)


def test_a_batch_request_sees_saturated_gpus_as_busier() -> None:
    facts = [Facts(load=1, saturated=True), Facts(load=3)]

    assert 1 == choose(facts, CFG, rng(), batch=True).index
    assert 0 == choose(facts, CFG, rng(), batch=False).index


# -- affinity --------------------------------------------------------------------------------


def test_the_endpoint_holding_the_prompt_wins_over_a_slightly_less_loaded_one() -> None:
    facts = [Facts(load=3, prefix_blocks=10), Facts(load=1)]

    choice = choose(facts, CFG, rng(), blocks=10)

    assert (0, Reason.PREFIX) == (choice.index, choice.reason)


def test_the_load_balance_override_ignores_affinity_on_a_much_busier_endpoint() -> None:
    busy = CFG.balance_abs + 2
    facts = [Facts(load=busy, prefix_blocks=10, session=True), Facts(load=1)]

    choice = choose(facts, CFG, rng(), blocks=10)

    assert (1, Reason.BALANCE) == (choice.index, choice.reason)


def test_engine_load_ignores_prefix_and_session_but_not_lora() -> None:
    facts = [Facts(load=3, prefix_blocks=10, session=True), Facts(load=2), Facts(load=4, lora=True)]

    assert 2 == choose(facts, CFG, rng(), blocks=10, affinity=False).index


def test_session_id_comes_from_the_header_else_the_bodys_user() -> None:
    assert "s-1" == session_key([(b"X-Session-Id", b"s-1")], {"user": "alice"})
    assert "alice" == session_key([], {"user": "alice"})
    assert "" == session_key([], {"user": 42})
    assert 128 >= len(session_key([(b"x-session-id", b"k" * 10_000)], None))


# -- the router ------------------------------------------------------------------------------


def test_requests_sharing_a_system_prompt_follow_it_to_one_endpoint() -> None:
    r, eps = router(), endpoints(4)
    first = send(r, eps, chat(SYSTEM, "question one"))
    first.outstanding = 2  # it is busier now, but holds the prompt

    later = [send(r, eps, chat(SYSTEM, f"question {i}")) for i in range(5)]

    assert [first] * 5 == later


def test_uniform_prompts_spread_by_load_alone() -> None:
    r, eps = router(), endpoints(4)
    counts: Counter[str] = Counter()
    for i in range(40):
        chosen = send(r, eps, chat(f"unrelated system prompt number {i} " * 20, "q"))
        chosen.outstanding += 1  # none finishes: the load must spread
        counts[chosen.url] += 1

    assert [10, 10, 10, 10] == sorted(counts.values())


def test_a_session_stays_on_its_endpoint_unless_it_is_overloaded_or_out() -> None:
    r, eps = router(), endpoints(3)
    home = send(r, eps, {"model": "m", "prompt": "hi"}, headers=[(b"x-session-id", b"conv-9")])
    home.outstanding = 1

    again = send(r, eps, {"model": "m", "prompt": "more"}, headers=[(b"x-session-id", b"conv-9")])
    home.outstanding = 20
    overloaded = send(r, eps, {"model": "m", "prompt": "x"}, headers=[(b"x-session-id", b"conv-9")])
    home.outstanding = 1
    home.down = True
    out = send(r, eps, {"model": "m", "prompt": "y"}, headers=[(b"x-session-id", b"conv-9")])

    assert home is again
    assert home is not overloaded
    assert home is not out


def test_a_lora_adapter_resident_on_one_endpoint_gets_its_requests_while_it_has_room() -> None:
    eps = endpoints(3)
    signals = {
        "http://e0": signal(2, 0),
        "http://e1": signal(3, 0, loras=frozenset({"m"})),
        "http://e2": signal(1, 0),
    }
    r = router("engine_load", signals)

    with_room = send(r, eps, {"model": "m", "prompt": "select"})
    signals["http://e1"] = signal(8, 6, loras=frozenset({"m"}))
    full = send(r, eps, {"model": "m", "prompt": "select"})

    assert "http://e1" == with_room.url
    assert "http://e1" != full.url


def test_engine_load_sends_a_slow_engine_with_a_queue_nothing_while_others_are_idle() -> None:
    eps = endpoints(4)
    signals = {ep.url: signal(1, 0) for ep in eps}
    signals["http://e3"] = signal(8, 12)  # 4x slower: its queue grew
    r = router("engine_load", signals)

    chosen = {send(r, eps, {"model": "m", "prompt": "p"}).url for _ in range(20)}

    assert "http://e3" not in chosen


def test_stale_engine_metrics_fall_back_to_outstanding_counts() -> None:
    eps = endpoints(2)
    eps[0].outstanding, eps[1].outstanding = 0, 5
    r = router("engine_load", {})  # no fresh reading for anyone

    assert eps[0] is send(r, eps, {"model": "m", "prompt": "p"})


def test_least_outstanding_is_wave_ones_power_of_two_choices() -> None:
    r, eps = router("least_outstanding"), endpoints(2)
    eps[0].outstanding = 9
    planned = r.route("m", None, chat(SYSTEM, "q"))

    chosen, reason = r.pick(planned, eps, rng(), 0.0)

    assert (eps[1], Reason.P2C) == (chosen, reason)
    assert [] == planned.hashes  # nothing is hashed for a policy that does not use it


def test_the_router_never_picks_an_unavailable_or_excluded_endpoint() -> None:
    r, eps = router(), endpoints(3)
    send(r, eps[:1], chat(SYSTEM, "q"))  # e0 holds the prompt
    eps[0].down = True
    planned = r.route("m", None, chat(SYSTEM, "q2"))

    chosen, _ = r.pick(planned, eps, rng(), 0.0, exclude={"http://e1"})

    assert eps[2] is chosen


def test_sessions_are_bounded() -> None:
    r, eps = router(max_sessions=2), endpoints(2)
    for i in range(5):
        send(r, eps, {"model": "m", "prompt": "p", "user": f"user-{i}"})

    assert "sessions=2" in repr(r)


@pytest.mark.parametrize("policy", ["engine_load", "prefix_affinity"])
def test_one_available_endpoint_is_chosen_whatever_the_policy(policy: str) -> None:
    r, eps = router(policy), endpoints(2)
    eps[1].down = True

    assert eps[0] is send(r, eps, {"model": "m", "prompt": "p"})


def test_an_upstreams_routing_wins_over_the_models_and_the_default_covers_the_rest() -> None:
    upstreams = [
        UpstreamConfig(id="a", url="http://127.0.0.1:1", models=["m", "n"]),
        UpstreamConfig(
            id="b", url="http://127.0.0.1:2", models=["n"], routing={"policy": "engine_load"}
        ),
    ]
    models = [ModelConfig(name="m", routing={"policy": "least_outstanding"}),
              ModelConfig(name="n", routing={"policy": "least_outstanding"})]  # fmt: skip
    policy = policy_table(upstreams, models)

    assert "least_outstanding" == policy("m", None).policy
    assert "engine_load" == policy("n", None).policy
    assert "engine_load" == policy("m", "b").policy
    assert "prefix_affinity" == policy("other", None).policy


def test_an_endpoint_that_asked_to_back_off_is_a_last_resort() -> None:
    r, eps = router(), endpoints(2)
    send(r, eps[:1], chat(SYSTEM, "q"))  # e0 holds the prompt...
    eps[0].backoff_until = 10.0  # ...but answered 429 with Retry-After

    assert eps[1] is send(r, eps, chat(SYSTEM, "q2"))
    eps[1].down = True
    assert eps[0] is send(r, eps, chat(SYSTEM, "q3"))


def test_ties_go_to_the_lower_latency_when_it_is_known_else_at_random() -> None:
    facts = [Facts(load=1), Facts(load=1), Facts(load=1)]
    seen = {choose(facts, CFG, random.Random(seed)).index for seed in range(30)}

    assert 2 == choose(facts, CFG, rng(), latencies=[0.3, None, 0.1]).index
    assert {0, 1, 2} == seen


def test_a_cacheable_prompts_ties_ignore_latency_which_only_tells_past_cache_hits() -> None:
    r, eps = router(), endpoints(3)
    for ep, seconds in zip(eps, (0.001, 0.5, 0.5), strict=True):  # e0 answered cached ones
        ep.latency_ewma_s, ep.latency_at = seconds, 0.0
    chosen = {send(r, eps, chat(f"system prompt {i} " * 30, "q"), seed=i).url for i in range(30)}

    assert 1 < len(chosen)


@pytest.mark.parametrize("seed", range(40))
def test_a_prompt_under_one_block_is_chosen_as_choose_would_by_load_then_latency(
    seed: int,
) -> None:
    """Router.pick answers a request only load can decide (no blocks, no session, no engine
    reading) without building Facts: the same endpoint and reason as :func:`choose`, drawing
    the same random numbers."""
    draw = random.Random(seed)
    eps = endpoints(draw.randint(2, 5))
    for ep in eps:
        ep.outstanding = draw.randint(0, 2)
        ep.latency_ewma_s = draw.choice([None, 0.1, 0.2])
        ep.latency_at = 0.0
    r = router()
    planned = r.route("m", None, {"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    assert planned.hashes == []

    chosen, reason = r.pick(planned, eps, random.Random(seed), 1.0)

    facts = [Facts(float(ep.outstanding)) for ep in eps]
    latencies = [ep.latency_ewma_s for ep in eps]
    expected = choose(facts, CFG, random.Random(seed), latencies=latencies)
    assert (chosen, reason) == (eps[expected.index], expected.reason)
