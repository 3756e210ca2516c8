"""metrics.observer and incrementer: the request path's histograms and counters counted as
``Histogram.observe`` and ``Counter.inc`` count them.

The proxy observes five to seven values per request through :func:`gpugate.metrics.observer`
(bisection, no per-call checks) and counts three counters through
:func:`gpugate.metrics.incrementer` (no checks, no lock); what ``/metrics`` shows must be exactly
what prometheus_client's own ``observe`` and ``inc`` would have shown, bucket for bucket, at
every boundary, also when the two ways count into one child.
"""

from __future__ import annotations

import math

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.exposition import generate_latest

from gpugate.metrics import Metrics, incrementer, observer

BUCKETS = (0.001, 0.005, 0.01, 0.1, 1.0, 10.0)
VALUES = [0.0, 0.0005, 0.001, 0.0010001, 0.005, 0.0099, 0.01, 0.5, 1.0, 9.99, 10.0, 10.5, 1e9, -1.0]


def exposition(*, observe_each: bool) -> bytes:
    registry = CollectorRegistry()
    histogram = Histogram("h", "h", ["k"], buckets=BUCKETS, registry=registry)
    child = histogram.labels("a")
    observe = child.observe if observe_each else observer(child)
    for value in VALUES:
        observe(value)
    return b"\n".join(
        line for line in generate_latest(registry).splitlines() if b"_created" not in line
    )


def test_the_observer_counts_every_value_in_the_bucket_observe_puts_it_in() -> None:
    assert exposition(observe_each=True) == exposition(observe_each=False)


def test_a_nan_is_summed_and_counted_in_no_bucket_as_observe_does() -> None:
    registry = CollectorRegistry()
    both = [Histogram(n, n, buckets=BUCKETS, registry=registry) for n in ("a", "b")]
    both[0].observe(math.nan)
    observer(both[1])(math.nan)
    counts = [
        [s.value for s in metric.collect()[0].samples if s.name.endswith("_bucket")]
        for metric in both
    ]
    assert counts[0] == counts[1]


@pytest.mark.parametrize(
    ("name", "labels"),
    [("overhead", ()), ("request_duration", ("m", "interactive")), ("time_to_first_token", ("m",))],
)
def test_the_gateways_own_histograms_are_observed_through_it(
    name: str, labels: tuple[str, ...]
) -> None:
    metric = getattr(Metrics(), name)
    observer(metric.labels(*labels) if labels else metric)(0.002)
    samples = metric.collect()[0].samples
    assert [1.0] == [s.value for s in samples if s.name.endswith("_count")]


def test_counts_made_before_and_after_the_observer_add_up_in_one_child() -> None:
    registry = CollectorRegistry()
    child = Histogram("h", "h", ["k"], buckets=BUCKETS, registry=registry).labels("a")
    child.observe(0.002)
    fast = observer(child)
    fast(0.002)
    child.observe(50.0)
    samples = {(s.name, s.labels.get("le")): s.value for s in registry.collect().__next__().samples}
    assert samples["h_bucket", "0.005"] == 2.0
    assert samples["h_count", None] == 3.0
    assert samples["h_sum", None] == pytest.approx(50.004)


def test_the_incrementer_counts_as_inc_does_beside_it() -> None:
    registry = CollectorRegistry()
    child = Counter("c", "c", ["k"], registry=registry).labels("a")
    child.inc()
    count = incrementer(child)
    count()
    count()
    child.inc(2)
    assert registry.get_sample_value("c_total", {"k": "a"}) == 5.0
