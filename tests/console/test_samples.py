"""The console's ring of samples, read from a real :class:`Metrics` as the gateway fills it."""

from __future__ import annotations

import asyncio

import pytest

from gpugate.clock import ManualClock
from gpugate.metrics import Metrics
from gpugate.services.samples import (
    MAX_KEYS,
    SERIES,
    Sampler,
    Series,
    gauge,
    quantile,
)

EVERY_S = 5.0


def sampler(metrics: Metrics, clock: ManualClock, keep: int = 720) -> Sampler:
    return Sampler(metrics.read, clock, every_s=EVERY_S, keep=keep)


def values(ring: Sampler, name: str) -> dict[str, list[float]]:
    return {k: [v for _, v in points] for k, points in ring.window(name).items()}


def test_requests_per_second_by_code_are_the_counters_increase_over_the_interval() -> None:
    metrics, clock = Metrics(), ManualClock()
    ring = sampler(metrics, clock)
    ok = metrics.requests.labels("m", "a", "interactive", "200")
    ok.inc(3)
    ring.tick()  # the first sample has nothing to compare with: no rate yet
    ok.inc(10)
    metrics.requests.labels("m", "", "interactive", "NO_HEALTHY_UPSTREAM").inc(5)
    clock.advance(EVERY_S)
    ring.tick()
    assert {"200": [2.0], "NO_HEALTHY_UPSTREAM": [1.0]} == values(ring, "requests")


def test_latency_percentiles_come_from_the_buckets_observed_since_the_last_sample() -> None:
    metrics, clock = Metrics(), ManualClock()
    ring = sampler(metrics, clock)
    timer = metrics.request_duration.labels("m", "interactive")
    for _ in range(100):
        timer.observe(20.0)  # before the window: must not count
    ring.tick()
    for _ in range(99):
        timer.observe(0.003)  # in the first bucket, (0, 0.005]
    timer.observe(0.2)  # one slow request, in (0.1, 0.25]
    clock.advance(EVERY_S)
    ring.tick()
    latency = values(ring, "latency")
    assert [pytest.approx(0.005 * 50 / 99 * 1000)] == latency["p50"]
    assert [pytest.approx(5.0)] == latency["p99"]  # rank 99 of 100: the first bucket's top


def test_an_interval_without_requests_leaves_a_gap_not_a_zero_latency() -> None:
    metrics, clock = Metrics(), ManualClock()
    ring = sampler(metrics, clock)
    ring.tick()
    clock.advance(EVERY_S)
    ring.tick()
    assert {} == ring.window("latency")


def test_a_quantile_in_the_infinite_bucket_is_the_highest_finite_bound() -> None:
    assert 10.0 == quantile(0.99, [(5.0, 1.0), (10.0, 1.0), (float("inf"), 4.0)])
    assert quantile(0.5, [(5.0, 0.0), (float("inf"), 0.0)]) is None


def test_gpu_readings_and_queue_depth_are_gauges_by_gpu_and_by_class() -> None:
    metrics, clock = Metrics(), ManualClock()
    ring = sampler(metrics, clock)
    metrics.gpu_util.labels("node-a", "0", "").set(97)
    metrics.gpu_temp.labels("node-a", "0", "").set(81)
    metrics.queue_depth.labels("a", "batch").set(2)
    metrics.queue_depth.labels("b", "batch").set(3)
    metrics.runtime_spend_today.labels("home-1").set(250)
    ring.tick()
    assert {"node-a/0": [97.0]} == values(ring, "gpu_util")
    assert {"node-a/0": [81.0]} == values(ring, "gpu_temp")
    assert {"batch": [5.0]} == values(ring, "queue")  # summed over the upstreams
    assert {"home-1": [2.5]} == values(ring, "spend_today")  # dollars


def test_the_ring_keeps_the_newest_samples_only() -> None:
    metrics, clock = Metrics(), ManualClock()
    ring = sampler(metrics, clock, keep=3)
    for i in range(5):
        metrics.queue_depth.labels("a", "batch").set(i)
        ring.tick()
        clock.advance(EVERY_S)
    assert 3 == len(ring)
    assert {"batch": [2.0, 3.0, 4.0]} == values(ring, "queue")
    first, last = ring.window("queue")["batch"][0][0], ring.window("queue")["batch"][-1][0]
    assert 2 * EVERY_S == last - first


def test_a_series_keeps_a_bounded_number_of_keys_and_counts_the_rest() -> None:
    metrics, clock = Metrics(), ManualClock()
    for i in range(MAX_KEYS + 3):
        metrics.runtime_queue_depth.labels(f"r{i:02}").set(1)
    ring = sampler(metrics, clock)
    ring.tick()
    assert MAX_KEYS == len(ring.window("jobs_queued"))
    assert "dropped_keys=3" in repr(ring)


def test_a_new_series_is_one_line_over_an_existing_metric() -> None:
    metrics, clock = Metrics(), ManualClock()
    inflight = Series(
        "inflight", "In flight", "requests", gauge("gateway_upstream_inflight", ["upstream"])
    )
    ring = Sampler(metrics.read, clock, series=(*SERIES, inflight))
    metrics.upstream_inflight.labels("a").set(4)
    ring.tick()
    assert {"a": [4.0]} == values(ring, "inflight")


async def test_the_loop_takes_a_sample_every_interval() -> None:
    metrics, clock = Metrics(), ManualClock()
    ring = sampler(metrics, clock)

    task = asyncio.create_task(ring.run())
    try:
        async with asyncio.timeout(5):
            while len(ring) < 1:
                await asyncio.sleep(0)
            clock.advance(EVERY_S)
            while len(ring) < 2:
                await asyncio.sleep(0)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert 2 == len(ring)


def test_tokens_per_second_are_summed_by_tenant() -> None:
    metrics, clock = Metrics(), ManualClock()
    ring = sampler(metrics, clock)
    ring.tick()
    metrics.tokens.labels("acme", "m", "prompt").inc(40)
    metrics.tokens.labels("acme", "m", "completion").inc(10)
    clock.advance(EVERY_S)
    ring.tick()
    metrics.tokens_by_key.labels("gk_ab12", "prompt").inc(25)
    clock.advance(EVERY_S)
    ring.tick()
    assert {"acme": [10.0, 0.0]} == values(ring, "tokens")
    assert {"gk_ab12": [5.0]} == values(ring, "key_tokens")


def test_retries_and_fallbacks_are_rates_by_outcome_and_by_reason() -> None:
    metrics, clock = Metrics(), ManualClock()
    if not hasattr(metrics, "fallbacks"):
        pytest.skip("gateway_fallbacks_total arrives with the resil branch (issue #13)")
    ring = sampler(metrics, clock)
    ring.tick()
    metrics.upstream_attempts.labels("a", "retried").inc(5)
    metrics.fallbacks.labels("m", "m-small", "unavailable").inc(10)
    clock.advance(EVERY_S)
    ring.tick()
    assert {"retried": [1.0]} == values(ring, "attempts")
    assert {"unavailable": [2.0]} == values(ring, "fallbacks")
