from __future__ import annotations

import asyncio
import random
from collections import Counter

import pytest

from gpugate.clock import ManualClock
from gpugate.core.picking import (
    WINDOW_SLICES,
    EjectionPolicy,
    EndpointState,
    Health,
    claim,
    health,
    latency,
    mark_probe_result,
    pick,
    record_failure,
    record_latency,
    record_load_signal,
    record_success,
    release,
    try_acquire_probe,
)
from gpugate.errors import NoHealthyUpstream


def endpoint(
    port: int = 8001,
    *,
    upstream_id: str = "qwen-35b",
    outstanding: int = 0,
    latency_s: float | None = None,
    policy: EjectionPolicy | None = None,
) -> EndpointState:
    return EndpointState(
        upstream_id=upstream_id,
        url=f"http://127.0.0.1:{port}",
        policy=policy or EjectionPolicy(),
        outstanding=outstanding,
        latency_ewma_s=latency_s,
    )


def fail(ep: EndpointState, times: int, now: float = 0.0) -> None:
    for _ in range(times):
        record_failure(ep, now)


def ejected(now: float = 0.0) -> EndpointState:
    """An endpoint ejected at ``now`` by five failures in a row."""
    ep = endpoint()
    fail(ep, 5, now)
    assert health(ep, now) is Health.EJECTED
    return ep


def picks(candidates: list[EndpointState], n: int = 200, seed: int = 7) -> Counter[str]:
    rng = random.Random(seed)
    return Counter(pick(candidates, rng, now=0.0).url for _ in range(n))


# picking


def test_the_endpoint_with_fewer_outstanding_requests_is_picked() -> None:
    busy, idle = endpoint(8001, outstanding=3), endpoint(8002, outstanding=1)

    assert Counter({idle.url: 200}) == picks([busy, idle])


def test_power_of_two_choices_never_picks_the_most_loaded_of_three() -> None:
    eps = [
        endpoint(8001, outstanding=0),
        endpoint(8002, outstanding=1),
        endpoint(8003, outstanding=9),
    ]

    counts = picks(eps, n=600)

    assert counts[eps[2].url] == 0
    assert counts[eps[0].url] > counts[eps[1].url] > 0


def test_a_tie_on_outstanding_goes_to_the_lower_latency_ewma() -> None:
    slow, fast = endpoint(8001, latency_s=2.0), endpoint(8002, latency_s=0.2)

    assert Counter({fast.url: 200}) == picks([slow, fast])


def test_a_tie_without_latency_is_broken_at_random() -> None:
    a, b = endpoint(8001), endpoint(8002)

    counts = picks([a, b], n=400)

    assert 150 < counts[a.url] < 250, counts


def test_the_same_seed_picks_the_same_sequence() -> None:
    eps = [endpoint(port) for port in range(8001, 8006)]
    rng_a, rng_b = random.Random(3), random.Random(3)

    first = [pick(eps, rng_a, 0.0).url for _ in range(50)]
    second = [pick(eps, rng_b, 0.0).url for _ in range(50)]

    assert first == second


def test_excluded_urls_are_not_picked() -> None:
    tried, other = endpoint(8001), endpoint(8002, outstanding=5)

    assert Counter({other.url: 200}) == Counter(
        pick([tried, other], random.Random(1), 0.0, exclude={tried.url}).url for _ in range(200)
    )


def test_ejected_and_down_endpoints_are_not_picked() -> None:
    out, down, ok = ejected(), endpoint(8002), endpoint(8003, outstanding=7)
    mark_probe_result(down, ok=False, now=0.0)
    mark_probe_result(down, ok=False, now=0.0)

    assert Counter({ok.url: 200}) == picks([out, down, ok])


def test_no_available_endpoint_raises_no_healthy_upstream_with_a_summary() -> None:
    out, tried = ejected(now=0.0), endpoint(8002)

    with pytest.raises(NoHealthyUpstream) as caught:
        pick([out, tried], random.Random(1), now=1.0, exclude={tried.url})

    expected = "no healthy endpoint among 2 (1 already tried, 1 ejected)"
    assert expected == caught.value.message
    assert caught.value.retry_after_s == 4.0  # the ejection ends at 5.0


def test_no_candidates_at_all_raises_no_healthy_upstream() -> None:
    with pytest.raises(NoHealthyUpstream):
        pick([], random.Random(1), now=0.0)


# passive health


def test_one_failure_does_not_eject() -> None:
    ep = endpoint(policy=EjectionPolicy(min_samples=1, failure_ratio=0.1))

    record_failure(ep, 0.0)

    assert health(ep, 0.0) == Health.HEALTHY


def test_four_failures_in_a_row_do_not_eject_but_five_do() -> None:
    ep = endpoint()
    fail(ep, 4)
    assert health(ep, 0.0) == Health.HEALTHY

    record_failure(ep, 0.0)

    assert health(ep, 0.0) == Health.EJECTED
    assert repr(ep) == "<Endpoint qwen-35b http://127.0.0.1:8001 out=0 ejected until=5 cooldown=5s>"


def test_five_failures_in_a_row_eject_even_among_many_successes() -> None:
    ep = endpoint()
    for _ in range(100):
        record_success(ep, 0.0)

    fail(ep, 5)

    assert health(ep, 0.0) == Health.EJECTED


def test_a_failure_ratio_at_or_above_half_ejects_once_min_samples_are_in() -> None:
    ep = endpoint()
    for ok in (True, False, True, False):
        (record_success if ok else record_failure)(ep, 0.0)
    assert health(ep, 0.0) == Health.HEALTHY  # 2 of 4: too few samples

    record_failure(ep, 0.0)  # 3 of 5

    assert health(ep, 0.0) == Health.EJECTED


def test_failures_older_than_the_window_do_not_count() -> None:
    ep = endpoint()
    for ok in (False, True, False, True):
        (record_success if ok else record_failure)(ep, 0.0)

    record_failure(ep, 10.0)  # the window (10 s) now holds just this one

    assert health(ep, 10.0) == Health.HEALTHY


def test_the_window_holds_a_bounded_count_of_slices_whatever_the_request_rate() -> None:
    ep = endpoint()
    for k in range(50_000):  # 5,000 requests/s for 10 s, then one more
        record_success(ep, k / 5_000)
    record_failure(ep, 10.0)

    assert len(ep.outcomes) <= WINDOW_SLICES + 1
    assert ep.window_failures == 1
    assert 47_000 < ep.window_samples <= 50_001  # the last 10 s, less up to one slice


def test_failures_leave_the_window_when_their_slice_is_as_old_as_the_window() -> None:
    ep = endpoint(policy=EjectionPolicy(min_samples=3, failure_ratio=0.5))
    record_failure(ep, 0.2)
    record_failure(ep, 0.4)

    record_success(ep, 10.0)  # the slice [0, 0.5) started 10 s ago: out
    record_failure(ep, 10.0)

    assert ep.window_failures == 1
    assert health(ep, 10.0) == Health.HEALTHY


def test_an_ejected_endpoint_is_half_open_after_its_cooldown() -> None:
    ep = ejected(now=0.0)

    assert health(ep, 4.9) == Health.EJECTED
    assert health(ep, 5.0) == Health.HALF_OPEN


def test_a_half_open_endpoint_lets_exactly_one_probe_through() -> None:
    ep = ejected(now=0.0)
    rng = random.Random(1)

    assert ep is pick([ep], rng, 5.0)
    assert claim(ep, 5.0) is True
    assert repr(ep) == "<Endpoint qwen-35b http://127.0.0.1:8001 out=1 probing>"
    assert try_acquire_probe(ep, 5.0) is False
    with pytest.raises(NoHealthyUpstream):
        pick([ep], rng, 5.0)


def test_a_successful_probe_closes_the_circuit_and_resets_the_cooldown() -> None:
    ep = ejected(now=0.0)
    probe = claim(ep, 5.0)
    record_failure(ep, 5.1)  # fails: out for 10 s
    release(ep, probe=probe)
    probe = claim(ep, 15.1)

    record_success(ep, 16.0)
    release(ep, probe=probe)

    assert health(ep, 16.0) == Health.HEALTHY
    assert repr(ep) == "<Endpoint qwen-35b http://127.0.0.1:8001 out=0 healthy>"
    fail(ep, 5, now=17.0)
    assert ep.cooldown_s == 5.0  # back to the base cooldown


def test_a_failed_probe_ejects_again_for_twice_as_long_up_to_the_maximum() -> None:
    ep = ejected(now=0.0)
    now, cooldowns = 0.0, []
    for _ in range(6):
        now = ep.ejected_until or now
        assert try_acquire_probe(ep, now)
        record_failure(ep, now)
        cooldowns.append(ep.cooldown_s)

    assert cooldowns == [10.0, 20.0, 40.0, 60.0, 60.0, 60.0]
    assert health(ep, now) == Health.EJECTED


def test_a_probe_that_records_no_outcome_gives_its_slot_back() -> None:
    ep = ejected(now=0.0)
    probe = claim(ep, 5.0)

    release(ep, probe=probe)  # e.g. the client went away

    assert try_acquire_probe(ep, 6.0) is True


def test_a_late_success_of_a_request_sent_before_the_ejection_does_not_close_it() -> None:
    ep = ejected(now=0.0)

    record_success(ep, 1.0)

    assert health(ep, 1.0) == Health.EJECTED


def test_claiming_an_endpoint_that_is_not_available_raises() -> None:
    ep = ejected(now=0.0)

    with pytest.raises(NoHealthyUpstream):
        claim(ep, 1.0)
    assert ep.outstanding == 0


def test_claim_and_release_count_outstanding_requests() -> None:
    ep = endpoint()

    probes = [claim(ep, 0.0), claim(ep, 0.0)]
    assert probes == [False, False]
    assert ep.outstanding == 2
    release(ep, probe=False)
    release(ep, probe=False)
    release(ep, probe=False)  # one too many never goes below zero

    assert ep.outstanding == 0


# active health


def test_the_prober_marks_an_endpoint_down_after_two_failed_probes_and_up_after_one_success() -> (
    None
):
    ep = endpoint()

    mark_probe_result(ep, ok=False, now=0.0)
    assert health(ep, 0.0) == Health.HEALTHY
    mark_probe_result(ep, ok=False, now=1.0)
    assert health(ep, 1.0) == Health.DOWN
    assert repr(ep) == "<Endpoint qwen-35b http://127.0.0.1:8001 out=0 down>"

    mark_probe_result(ep, ok=True, now=2.0)

    assert health(ep, 2.0) == Health.HEALTHY


def test_a_probe_success_between_failures_resets_the_count() -> None:
    ep = endpoint()

    for ok in (False, True, False):
        mark_probe_result(ep, ok=ok, now=0.0)

    assert health(ep, 0.0) == Health.HEALTHY


# latency


def test_the_first_latency_sets_the_ewma_and_later_ones_blend_in() -> None:
    ep = endpoint()

    record_latency(ep, 1.0)
    assert ep.latency_ewma_s == 1.0
    record_latency(ep, 2.0, alpha=0.5)

    assert ep.latency_ewma_s == 1.5


# policy


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"consecutive_failures": 1}, "consecutive_failures must be at least 2"),
        ({"failure_ratio": 0.0}, "failure_ratio must be in (0, 1]"),
        ({"max_cooldown_s": 1.0}, "max_cooldown_s must be >= cooldown_s"),
    ],
)
def test_a_nonsensical_policy_is_refused(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("]", r"\]")):
        EjectionPolicy(**kwargs)  # type: ignore[arg-type]


# simulation


async def test_a_slow_endpoint_gets_measurably_fewer_requests_than_a_fast_one() -> None:
    """Simulated: 50 requests/s for 40 s; one endpoint serves in 40 ms, the other in 400 ms."""
    clock, rng = ManualClock(), random.Random(2026)
    fast, slow = endpoint(8001), endpoint(8002)
    service_s = {fast.url: 0.04, slow.url: 0.4}
    counts: Counter[str] = Counter()
    requests: list[asyncio.Task[None]] = []

    async def serve(ep: EndpointState) -> None:
        probe = claim(ep, clock.monotonic())
        started = clock.monotonic()
        await clock.sleep(service_s[ep.url])
        record_latency(ep, clock.monotonic() - started)
        record_success(ep, clock.monotonic())
        release(ep, probe=probe)

    for _ in range(2000):
        ep = pick([fast, slow], rng, clock.monotonic())
        counts[ep.url] += 1
        requests.append(asyncio.create_task(serve(ep)))
        await asyncio.sleep(0)  # let it claim
        clock.advance(0.02)
        await asyncio.sleep(0)  # let finished requests release
    clock.advance(1.0)
    await asyncio.gather(*requests)

    split = f"fast={counts[fast.url]} slow={counts[slow.url]}"
    print(split)
    assert counts[slow.url] * 4 < counts[fast.url], split
    assert counts[slow.url] > 0, split
    assert (fast.outstanding, slow.outstanding) == (0, 0)


def test_a_backed_off_endpoint_is_picked_only_when_nothing_else_is_available() -> None:
    """#14.2: a 429/503 is a load signal: its endpoint sits out its Retry-After (a last resort,
    never ejected), then competes again."""
    busy, calm = endpoint(8001), endpoint(8002)
    rng = random.Random(7)
    assert 2.0 == record_load_signal(busy, 100.0, 2.0)
    assert {calm} == {pick([busy, calm], rng, 100.5) for _ in range(50)}
    assert busy is pick([busy], rng, 100.5)  # alone, it is still tried: never "no upstream"
    assert Health.HEALTHY is health(busy, 100.5)
    assert {busy, calm} == {pick([busy, calm], rng, 102.5) for _ in range(50)}


def test_load_signals_without_retry_after_back_off_doubling_until_a_success() -> None:
    ep = endpoint()
    waits = [record_load_signal(ep, 0.0, None, base_s=1.0, max_s=8.0) for _ in range(5)]
    record_success(ep, 1.0)
    assert [1.0, 2.0, 4.0, 8.0, 8.0] == waits
    assert 1.0 == record_load_signal(ep, 2.0, None, base_s=1.0, max_s=8.0)


def test_an_idle_endpoints_latency_figure_decays_so_it_is_measured_again() -> None:
    ep = endpoint()
    record_latency(ep, 0.4, now=0.0)
    assert 0.4 == latency(ep, 5.0)
    assert latency(ep, 30.0) == pytest.approx(0.05)  # three half-lives later


def test_a_successful_active_probe_makes_an_ejected_endpoint_half_open_at_once() -> None:
    ep = endpoint()
    for _ in range(5):
        record_failure(ep, 10.0)
    assert Health.EJECTED is health(ep, 10.1)
    mark_probe_result(ep, ok=True, now=10.2)
    assert Health.HALF_OPEN is health(ep, 10.2)
    probe = claim(ep, 10.2)
    record_success(ep, 10.3)
    release(ep, probe=probe)
    assert Health.HEALTHY is health(ep, 10.3)
