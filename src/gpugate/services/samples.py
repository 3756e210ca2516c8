"""The console's ring of samples: what the operator looks at first, every few seconds, in process.

Every ``every_s`` the :class:`Sampler` reads the gateway's own :class:`~gpugate.metrics.Metrics`
(no scrape, no text parsing: :meth:`Metrics.read`) and turns it into one :class:`Sample` — a
value per key for each named :class:`Series` — kept in a ring of ``keep`` samples (an hour at
5 s is 720), so memory is bounded whatever the traffic. A series is one line of :data:`SERIES`:
its name, title, unit, and how it is read from two consecutive readings —

* :func:`gauge`: the value now, summed by some labels (queue depth by class, GPU util per GPU);
* :func:`rate`: a counter's increase per second since the last sample (requests/s by code);
* :func:`quantiles`: percentiles of what a histogram observed since the last sample, from the
  deltas of its cumulative buckets, interpolated within a bucket as Prometheus'
  ``histogram_quantile`` does (latency p50/p99).

Adding a series (retries, fallbacks, tokens per key) is adding one line there; its metric only has
to exist on :class:`Metrics`. A series keeps at most :data:`MAX_KEYS` keys (the first, sorted);
the rest are counted in ``dropped_keys``, never stored. The per-day spend, which the store
already keeps, is not sampled here: the console reads it from the ledger.
"""

from __future__ import annotations

import asyncio
import math
import threading
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from gpugate.clock import Clock

Labels = Mapping[str, str]
Reading = Mapping[str, Sequence[tuple[Labels, float]]]  # metric samples by sample name
Values = dict[str, float]  # one sample of one series: key -> value
Read = Callable[[Reading, Reading | None, float], Values]  # (now, before, seconds between)
Point = tuple[float, float]  # (unix time, value)

MAX_KEYS = 12
GPU_LABELS = ("host", "gpu", "instance")


@dataclass(frozen=True, slots=True)
class Series:
    """A named series: what a chart of it is called, its unit, and how a sample is read."""

    name: str
    title: str
    unit: str
    read: Read


@dataclass(frozen=True, slots=True)
class Sample:
    """Every series' values at one moment (``at``: unix time)."""

    at: float
    values: Mapping[str, Values]


def _key(labels: Labels, by: Sequence[str]) -> str:
    """The labels ``by`` names, non-empty ones joined with ``/`` (GPU ``node-a/0``)."""
    return "/".join(v for v in (labels.get(name, "") for name in by) if v) or "—"


def _summed(samples: Sequence[tuple[Labels, float]], by: Sequence[str]) -> Values:
    sums: Values = {}
    for labels, value in samples:
        if not math.isnan(value):
            key = _key(labels, by)
            sums[key] = sums.get(key, 0.0) + value
    return sums


def gauge(metric: str, by: Sequence[str], *, scale: float = 1.0) -> Read:
    """The gauge ``metric`` now, summed by the labels ``by``, times ``scale``."""

    def read(now: Reading, _before: Reading | None, _seconds: float) -> Values:
        return {k: v * scale for k, v in _summed(now.get(metric, ()), by).items()}

    return read


def rate(metric: str, by: Sequence[str]) -> Read:
    """The counter ``metric`` (``..._total``): its increase per second since the last sample,
    summed by the labels ``by``. A key that is new counts from zero; one that went down (the
    process restarted its counter) counts from zero again."""

    def read(now: Reading, before: Reading | None, seconds: float) -> Values:
        if before is None or seconds <= 0:
            return {}
        was = _summed(before.get(metric, ()), by)
        out: Values = {}
        for key, value in _summed(now.get(metric, ()), by).items():
            grown = value - was.get(key, 0.0)
            out[key] = (value if grown < 0 else grown) / seconds
        return out

    return read


def _buckets(samples: Iterable[tuple[Labels, float]]) -> dict[float, float]:
    """Cumulative counts by upper bound, summed over every other label."""
    counts: dict[float, float] = {}
    for labels, value in samples:
        le = float(labels["le"])
        counts[le] = counts.get(le, 0.0) + value
    return counts


def quantile(q: float, cumulative: Sequence[tuple[float, float]]) -> float | None:
    """The ``q`` quantile of observations in cumulative buckets ``[(upper bound, count)]``
    (sorted, the last bound ``+Inf``), linear within a bucket like ``histogram_quantile``;
    in the ``+Inf`` bucket it is the highest finite bound. None without observations."""
    if not cumulative or cumulative[-1][1] <= 0:
        return None
    rank = q * cumulative[-1][1]
    lower, below = 0.0, 0.0
    for upper, count in cumulative:
        if count >= rank and count > below:
            if math.isinf(upper):
                return lower
            return lower + (upper - lower) * (rank - below) / (count - below)
        lower, below = upper, count
    return lower


def quantiles(metric: str, qs: Sequence[float] = (0.5, 0.99), *, scale: float = 1000.0) -> Read:
    """Percentiles (``p50``, ``p99``) of what the histogram ``metric`` observed since the last
    sample, over all its label sets, times ``scale`` (seconds to ms); nothing observed, no key."""
    bucket = f"{metric}_bucket"

    def read(now: Reading, before: Reading | None, _seconds: float) -> Values:
        if before is None:
            return {}
        was = _buckets(before.get(bucket, ()))
        deltas = sorted(
            (le, n - was.get(le, 0.0)) for le, n in _buckets(now.get(bucket, ())).items()
        )
        if any(n < 0 for _, n in deltas):  # a reset: what is there now is all since then
            deltas = sorted(_buckets(now.get(bucket, ())).items())
        out: Values = {}
        for q in qs:
            value = quantile(q, deltas)
            if value is not None:
                out[f"p{q * 100:g}"] = value * scale
        return out

    return read


SERIES: tuple[Series, ...] = (
    Series("requests", "Requests by code", "req/s", rate("gateway_requests_total", ["code"])),
    Series("latency", "Request latency", "ms", quantiles("gateway_request_duration_seconds")),
    Series("ttfb", "Upstream time to first byte", "ms", quantiles("gateway_upstream_ttfb_seconds")),
    Series(
        "attempts",
        "Upstream tries by outcome",
        "tries/s",
        rate("gateway_upstream_attempts_total", ["outcome"]),
    ),
    Series(
        "fallbacks", "Fallbacks by reason", "req/s", rate("gateway_fallbacks_total", ["reason"])
    ),
    Series("tokens", "Tokens by tenant", "tokens/s", rate("gateway_tokens_total", ["tenant"])),
    Series("key_tokens", "Tokens by key", "tokens/s", rate("gateway_key_tokens_total", ["key"])),
    Series(
        "queue", "Requests queued by class", "requests", gauge("gateway_queue_depth", ["class"])
    ),
    Series("gpu_util", "GPU utilisation", "%", gauge("gateway_gpu_util_percent", GPU_LABELS)),
    Series(
        "gpu_temp", "GPU temperature", "°C", gauge("gateway_gpu_temperature_celsius", GPU_LABELS)
    ),
    Series("gpu_faulted", "GPU faulted", "", gauge("gateway_gpu_faulted", GPU_LABELS)),
    Series("jobs_queued", "Jobs queued", "jobs", gauge("gateway_runtime_queue_depth", ["runtime"])),
    Series(
        "jobs_in_flight",
        "Calls in flight",
        "calls",
        gauge("gateway_runtime_in_flight", ["runtime"]),
    ),
    Series(
        "spend_today",
        "Spend today",
        "$",
        gauge("gateway_runtime_spend_today_cents", ["runtime"], scale=0.01),
    ),
)
"""Every sampled series; a new one is one more line (its metric must exist on ``Metrics``)."""


class Sampler:
    """Reads ``read()`` every ``every_s`` into a ring of ``keep`` samples of ``series``."""

    def __init__(
        self,
        read: Callable[[], Reading],
        clock: Clock,
        *,
        every_s: float = 5.0,
        keep: int = 720,
        series: Sequence[Series] = SERIES,
    ) -> None:
        self._read = read
        self._clock = clock
        self.every_s = every_s
        self.series = {s.name: s for s in series}
        self._ring: deque[Sample] = deque(maxlen=max(2, keep))
        self._before: Reading | None = None
        self._before_at = 0.0
        self.dropped_keys = 0
        self._taking = threading.Lock()  # one sample at a time: each is a delta from the last
        self._ring_lock = threading.Lock()

    def tick(self) -> Sample:
        """Take one sample and keep it (the oldest goes when the ring is full)."""
        sample = self._take()
        self._keep(sample)
        return sample

    def _keep(self, sample: Sample) -> None:
        with self._ring_lock:
            self._ring.append(sample)

    def _samples(self) -> tuple[Sample, ...]:
        """The ring as it is now (a page may read it from a worker thread while the loop
        appends)."""
        with self._ring_lock:
            return tuple(self._ring)

    def _take(self) -> Sample:
        """Read the metrics and every series; the ring is not touched (this may run in a
        thread while the event loop reads the ring)."""
        with self._taking:
            return self._take_locked()

    def _take_locked(self) -> Sample:
        now, at = self._read(), self._clock.monotonic()
        seconds = at - self._before_at if self._before is not None else 0.0
        values = {}
        for name, series in self.series.items():
            read = series.read(now, self._before, seconds)
            kept = sorted(read)[:MAX_KEYS]
            self.dropped_keys += len(read) - len(kept)
            values[name] = {k: read[k] for k in kept}
        self._before, self._before_at = now, at
        return Sample(self._clock.now().timestamp(), values)

    async def run(self) -> None:
        """A sample every ``every_s``, read in a worker thread (a few ms with a big registry,
        bench/console_samples.py) so requests on the event loop do not wait for it."""
        while True:
            self._keep(await asyncio.to_thread(self._take))
            await self._clock.sleep(self.every_s)

    def window(self, name: str, keys: Iterable[str] | None = None) -> dict[str, list[Point]]:
        """Series ``name`` over the ring, oldest first: ``{key: [(unix time, value)]}``, only
        ``keys`` when given; a sample without a key leaves a gap, not a zero."""
        wanted = None if keys is None else set(keys)
        points: dict[str, list[Point]] = {}
        for sample in self._samples():
            for key, value in sample.values.get(name, {}).items():
                if wanted is None or key in wanted:
                    points.setdefault(key, []).append((sample.at, value))
        return points

    @property
    def span(self) -> tuple[float, float] | None:
        """The first and last sample's times; None before the first."""
        samples = self._samples()
        if not samples:
            return None
        return samples[0].at, samples[-1].at

    def __len__(self) -> int:
        return len(self._ring)

    def __repr__(self) -> str:
        return (
            f"<Sampler samples={len(self._ring)}/{self._ring.maxlen} every {self.every_s:g} s "
            f"series={len(self.series)} dropped_keys={self.dropped_keys}>"
        )
