"""Every Prometheus metric gpugate exports, declared once on the app's own registry.

This is the only module that imports ``prometheus_client``. A fresh :class:`Metrics` is built per
app (and per test), so nothing is registered globally and two gateways in one process do not
collide. Families keep the ``gateway_`` prefix (DESIGN §3).

With ``serve --workers N`` each worker keeps its own registry and ``/metrics`` is their merge
(:meth:`Metrics.exposition`, docs/decisions.md §21): counters and histograms summed, gauges by
what they mean (:data:`GAUGE_MERGE`), ``_created`` the earliest.
"""

from __future__ import annotations

import json
import math
from bisect import bisect_left
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector
from prometheus_client.values import MutexValue

from gpugate import __version__

# Buckets that resolve the gateway's own sub-millisecond overhead as well as long generations.
_OVERHEAD_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5)
_DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
# The GenAI semantic conventions' advised buckets (gen_ai.server.time_to_first_token,
# gen_ai.server.time_per_output_token, gen_ai.client.token.usage), so dashboards built for
# them read ours too.
_TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1,
    2.5,
    5,
    7.5,
    10,
)
_TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 2.5)
_TOKEN_BUCKETS = tuple(float(4**n) for n in range(14))  # 1, 4, 16, ... 67 108 864

#: The one label value for anything a client names that the config does not (a model no
#: upstream serves, ...): a client's input never becomes a label value (issue #15 finding 2).
UNKNOWN = "_unknown"
#: A label value that comes from outside (an upstream's status line, ...) is cut to this length.
MAX_LABEL_CHARS = 64


class _LoopValue:
    """A sample's value written from the event loop's thread only: prometheus_client's own
    (``MutexValue``) takes a lock around every ``inc``, and a chat request makes 13 of them."""

    __slots__ = ("_exemplar", "value")

    def __init__(self, value: float, exemplar: Any) -> None:
        self.value, self._exemplar = value, exemplar

    def inc(self, amount: float = 1) -> None:
        self.value += amount

    def set(self, value: float, timestamp: float | None = None) -> None:  # noqa: ARG002 - its signature
        self.value = value

    def set_exemplar(self, exemplar: Any) -> None:
        self._exemplar = exemplar

    def get(self) -> float:
        return self.value

    def get_exemplar(self) -> Any:
        return self._exemplar


def _unlocked(value: Any) -> Any:
    """``value`` (a child's sample) as a :class:`_LoopValue` with the same count; any other
    kind (multiprocess mode's) as it is."""
    if type(value) is not MutexValue:
        return value  # pragma: no cover - not prometheus_client's in-memory value
    return _LoopValue(value.get(), value.get_exemplar())  # type: ignore[no-untyped-call]


def observer(histogram: Histogram) -> Callable[[float], None]:
    """``histogram.observe`` (a labelled child, or a histogram without labels) made once for
    the hot path: the bucket found by bisection and no per-call checks, ~0.6 µs against
    1.6 to 2 µs for ``observe``, which walks the buckets in Python (a stream observes seven
    values). The same counts; prometheus_client's own ``observe`` where its parts differ.
    The child's values become :class:`_LoopValue`: observe it from the event loop only."""
    parts = vars(histogram)
    bounds: list[float] | None = parts.get("_upper_bounds")
    buckets: list[Any] | None = parts.get("_buckets")
    total = parts.get("_sum")
    if not bounds or buckets is None or total is None or len(buckets) != len(bounds):
        return histogram.observe  # pragma: no cover - another prometheus_client
    if bounds[-1] != math.inf:  # pragma: no cover - ditto
        return histogram.observe
    buckets[:] = [_unlocked(b) for b in buckets]
    total = parts["_sum"] = _unlocked(total)
    if type(total) is not _LoopValue or any(type(b) is not _LoopValue for b in buckets):
        return histogram.observe  # pragma: no cover - ditto (values it keeps its own way)

    def observe(amount: float) -> None:
        # the counts added to in place: two method calls fewer per observation
        if not math.isnan(amount):  # a NaN counts in no bucket, as prometheus_client's
            buckets[bisect_left(bounds, amount)].value += 1
        total.value += amount

    return observe


def incrementer(counter: Counter) -> Callable[[], None]:
    """``counter.inc`` (a labelled child) made once for the hot path: one added, without
    ``inc``'s checks and lock (its value becomes a :class:`_LoopValue`: count from the event
    loop only)."""
    parts = vars(counter)
    value = parts.get("_value")
    if value is None:
        return counter.inc  # pragma: no cover - another prometheus_client
    value = parts["_value"] = _unlocked(value)
    inc: Callable[[], None] = value.inc
    return inc


def bounded(value: str, known: Callable[[str], bool]) -> str:
    """``value`` as a label value when ``known(value)`` (the config names it), else
    :data:`UNKNOWN`; never longer than :data:`MAX_LABEL_CHARS`."""
    return value[:MAX_LABEL_CHARS] if value == "" or known(value) else UNKNOWN


class Metrics:
    """The gateway's metric families on a private registry."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self._workers = 1
        self._siblings: Callable[[], Awaitable[Sequence[bytes]]] | None = None
        self._restarts: Callable[[], int] = lambda: 0
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.build_info = Info("gateway_build", "gpugate build information", registry=r)
        self.build_info.info({"version": __version__})
        self.config_version = Gauge(
            "gateway_config_version", "Number of the gateway config version in effect", registry=r
        )
        self.requests = Counter(
            "gateway_requests_total",
            "Data-plane requests by model, upstream, class and response code",
            ["model", "upstream", "class", "code"],
            registry=r,
        )
        self.request_duration = Histogram(
            "gateway_request_duration_seconds",
            "Time from request received to response complete",
            ["model", "class"],
            buckets=_DURATION_BUCKETS,
            registry=r,
        )
        self.overhead = Histogram(
            "gateway_overhead_seconds",
            "Time spent in the gateway itself, excluding the upstream",
            buckets=_OVERHEAD_BUCKETS,
            registry=r,
        )
        self.upstream_ttfb = Histogram(
            "gateway_upstream_ttfb_seconds",
            "Time from sending to an upstream to its response headers",
            ["upstream"],
            buckets=_DURATION_BUCKETS,
            registry=r,
        )
        self.queue_wait = Histogram(
            "gateway_queue_wait_seconds",
            "Time a request waited in an upstream's admission queue",
            ["upstream", "class"],
            buckets=_DURATION_BUCKETS,
            registry=r,
        )
        # The sync path's rescues (issue #13): every try, every fallback, every continuation.
        self.upstream_attempts = Counter(
            "gateway_upstream_attempts_total",
            "Tries sent to an upstream by the sync path, by how each ended",
            ["upstream", "outcome"],
            registry=r,
        )
        self.fallbacks = Counter(
            "gateway_fallbacks_total",
            "Requests that went on to a fallback model, by model, fallback and reason",
            ["model", "to", "reason"],
            registry=r,
        )
        self.continuations = Counter(
            "gateway_continuations_total",
            "Streams broken after bytes reached the client, by model and how they were continued",
            ["model", "outcome"],
            registry=r,
        )
        # GenAI measurements at the relay (docs/observability.md), by the model that answered.
        self.time_to_first_token = Histogram(
            "gateway_time_to_first_token_seconds",
            "Time from a streamed request received to its first data event sent to the client",
            ["model"],
            buckets=_TTFT_BUCKETS,
            registry=r,
        )
        self.time_per_output_token = Histogram(
            "gateway_time_per_output_token_seconds",
            "Time per output token after the first, of streamed answers",
            ["model"],
            buckets=_TPOT_BUCKETS,
            registry=r,
        )
        self.tokens_per_request = Histogram(
            "gateway_tokens_per_request",
            "Tokens per answered request, by model and kind (input, output)",
            ["model", "kind"],
            buckets=_TOKEN_BUCKETS,
            registry=r,
        )
        self.overloaded = Counter(
            "gateway_overloaded_total",
            "Requests refused because the gateway itself ran out of a resource (file descriptors)",
            ["reason"],
            registry=r,
        )
        self.upstream_inflight = Gauge(
            "gateway_upstream_inflight",
            "Requests admitted to an upstream and not finished",
            ["upstream"],
            registry=r,
        )
        self.queue_depth = Gauge(
            "gateway_queue_depth",
            "Requests waiting for admission, by upstream and class",
            ["upstream", "class"],
            registry=r,
        )
        self.endpoint_healthy = Gauge(
            "gateway_endpoint_healthy",
            "1 when the endpoint is in rotation, 0 when ejected or failing its probe"
            " (endpoint: its index in the upstream's urls)",
            ["upstream", "endpoint"],
            registry=r,
        )
        self.idempotent_replays = Counter(
            "gateway_idempotent_replays_total",
            "Responses served from the idempotency store without an upstream call",
            registry=r,
        )
        # client keys (issue #16): tenants and models are bounded by the store and the config;
        # the key's prefix is a label only with auth.key_label (one series per key)
        self.tokens = Counter(
            "gateway_tokens_total",
            "Tokens used through client keys, by tenant, model and kind (prompt, completion)",
            ["tenant", "model", "kind"],
            registry=r,
        )
        self.tokens_by_key = Counter(
            "gateway_key_tokens_total",
            "Tokens used per client key prefix (only with auth.key_label: true)",
            ["key", "kind"],
            registry=r,
        )
        self.key_refusals = Counter(
            "gateway_key_refusals_total",
            "Requests a client key's limit or rules refused, by code",
            ["code"],
            registry=r,
        )

        gpu = ["host", "gpu", "instance"]
        self.gpu_util = Gauge("gateway_gpu_util_percent", "GPU utilisation (DCGM)", gpu, registry=r)
        self.gpu_temp = Gauge(
            "gateway_gpu_temperature_celsius", "GPU temperature (DCGM)", gpu, registry=r
        )
        self.gpu_last_xid = Gauge(
            "gateway_gpu_last_xid", "Last XID code the exporter reported (0: none)", gpu, registry=r
        )
        self.gpu_faulted = Gauge(
            "gateway_gpu_faulted", "1 while a fault holds the GPU out of rotation", gpu, registry=r
        )
        self.gpu_saturated = Gauge(
            "gateway_gpu_saturated", "1 while the GPU is saturated", gpu, registry=r
        )
        self.gpu_stale = Gauge(
            "gateway_gpu_stale", "1 while the GPU's data is stale (verdicts off)", gpu, registry=r
        )
        self.gpu_scrapes = Counter(
            "gateway_gpu_scrapes_total",
            "dcgm-exporter scrapes by exporter and outcome (ok or error)",
            ["exporter", "outcome"],
            registry=r,
        )
        self.gpu_scrape_duration = Histogram(
            "gateway_gpu_scrape_duration_seconds",
            "Time to fetch and parse one successful dcgm-exporter scrape",
            ["exporter"],
            buckets=_DURATION_BUCKETS,
            registry=r,
        )
        self.gpu_shed = Counter(
            "gateway_gpu_shed_total",
            "Batch admissions refused because the GPUs were saturated, by admission site",
            ["site"],
            registry=r,
        )

        self.runtime_queue_depth = Gauge(
            "gateway_runtime_queue_depth",
            "Jobs queued for each runtime (its runner), across replicas; refreshed every few s",
            ["runtime"],
            registry=r,
        )
        self.runtime_in_flight = Gauge(
            "gateway_runtime_in_flight",
            "Calls in flight on each runtime (leased), across replicas; refreshed every few s",
            ["runtime"],
            registry=r,
        )
        self.runtime_spend_today = Gauge(
            "gateway_runtime_spend_today_cents",
            "Each budgeted runtime's spend today (UTC): settled costs plus open reservations",
            ["runtime"],
            registry=r,
        )
        self.runtime_soft_cap = Gauge(
            "gateway_runtime_soft_cap",
            "1 while a runtime's spend today has reached its daily_cents (the soft-cap alert)",
            ["runtime"],
            registry=r,
        )
        self.runtime_over_budget = Gauge(
            "gateway_runtime_over_budget",
            "1 while a runtime's spend today has reached 2x daily_cents (skipped in the walk)",
            ["runtime"],
            registry=r,
        )
        self.runtime_auto_disabled = Counter(
            "gateway_runtime_auto_disabled",
            "Runtimes the gateway disabled and drained on its own, by stop condition",
            ["reason"],
            registry=r,
        )
        self.retention_purged = Counter(
            "gateway_retention_purged",
            "Rows the retention purge of this process deleted, by kind (jobs, batches, audit,"
            " ledger, idempotency)",
            ["kind"],
            registry=r,
        )
        self.runtime_drained_calls = Counter(
            "gateway_runtime_drained_calls",
            "Calls in flight cancelled because their runtime was drained or auto-disabled",
            ["runtime"],
            registry=r,
        )
        self.loop_restarts = Counter(  # labels: the loop names wiring starts (a fixed set)
            "gateway_loop_restarts",
            "Background loops restarted by the supervisor after they raised, by loop",
            ["loop"],
            registry=r,
        )
        # routing that knows the engines (docs/routing.md)
        self.engine_scrapes = Counter(
            "gateway_engine_scrapes_total",
            "Scrapes of model-server metrics by upstream and outcome (ok or error)",
            ["upstream", "outcome"],
            registry=r,
        )
        self.engine_load = Gauge(
            "gateway_engine_load",
            "An endpoint's engine as last read: running, waiting, kv_usage, prefix_hit_rate",
            ["upstream", "endpoint", "signal"],
            registry=r,
        )
        self.routing_picks = Counter(
            "gateway_routing_picks_total",
            "Endpoint choices by policy and what decided them (load, prefix, session, lora, "
            "balance: affinity overridden by load)",
            ["policy", "reason"],
            registry=r,
        )

    def count_jobs(
        self,
        dispatched: Callable[[], Mapping[str, int]],
        reaped: Callable[[], Mapping[str, int]],
        stuck: Callable[[], Mapping[str, int]],
    ) -> None:
        """Export this process's job-loop totals, read when scraped (nothing on the hot path):
        ``dispatched()`` and ``reaped()`` by outcome, ``stuck()`` by runtime."""
        self.registry.register(_JobTotals(dispatched, reaped, stuck))

    def read(self) -> dict[str, list[tuple[dict[str, str], float]]]:
        """Every sample of every family now, by sample name (``x_total``, ``x_bucket``, ...):
        what the console's sampler reads in process, with no scrape and no text parsing."""
        samples: dict[str, list[tuple[dict[str, str], float]]] = {}
        for family in self.registry.collect():
            for sample in family.samples:
                samples.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
        return samples

    def render(self) -> bytes:
        """The exposition text of every family (of this process)."""
        return generate_latest(self.registry)

    def join_workers(
        self,
        workers: int,
        siblings: Callable[[], Awaitable[Sequence[bytes]]],
        restarts: Callable[[], int],
    ) -> None:
        """Make this registry one of ``workers`` processes': :meth:`exposition` merges the
        snapshots ``siblings()`` returns (the others' :meth:`snapshot`, those that answered);
        ``restarts()`` is how many workers the supervisor restarted."""
        self._workers, self._siblings, self._restarts = workers, siblings, restarts

    async def exposition(self) -> bytes:
        """What ``/metrics`` serves: this process's families, or with workers every worker's
        merged into one view, plus ``gateway_workers*``."""
        if self._siblings is None:
            return self.render()
        others = await self._siblings()
        families = merge([self.snapshot(), *others])
        return generate_latest(_Fixed([*families, *self._worker_families(1 + len(others))]))

    def _worker_families(self, reporting: int) -> list[Metric]:
        configured = GaugeMetricFamily(
            "gateway_workers", "Worker processes of serve --workers", value=self._workers
        )
        answered = GaugeMetricFamily(
            "gateway_workers_reporting",
            "Workers whose metrics this scrape merged (fewer than gateway_workers: one was"
            " restarting or did not answer within 1 s)",
            value=reporting,
        )
        restarts = CounterMetricFamily(
            "gateway_worker_restarts",
            "Worker processes the supervisor restarted after they died",
            value=self._restarts(),
        )
        return [configured, answered, restarts]

    def snapshot(self) -> bytes:
        """Every family of this process as JSON, for a sibling's :meth:`exposition`."""
        return json.dumps(
            [
                [
                    f.name,
                    f.type,
                    f.documentation,
                    f.unit,
                    [[s.name, s.labels, s.value] for s in f.samples],
                ]
                for f in self.registry.collect()
            ],
            separators=(",", ":"),
        ).encode()

    def __repr__(self) -> str:
        return f"<Metrics families={len(list(self.registry.collect()))}>"


class _JobTotals(Collector):
    """The dispatcher's and the reaper's running totals as counter families."""

    def __init__(
        self,
        dispatched: Callable[[], Mapping[str, int]],
        reaped: Callable[[], Mapping[str, int]],
        stuck: Callable[[], Mapping[str, int]],
    ) -> None:
        self._sources = (
            (
                "gateway_jobs_dispatch",
                "Jobs the dispatcher of this process handled, by outcome",
                "outcome",
                dispatched,
            ),
            (
                "gateway_jobs_reaped",
                "Expired leases the reaper of this process handled, by outcome",
                "outcome",
                reaped,
            ),
            (
                "gateway_runtime_stuck_calls",
                "Calls found stuck (quiet for several reaper passes), by runtime",
                "runtime",
                stuck,
            ),
        )

    def collect(self) -> Iterator[Metric]:
        for name, documentation, label, read in self._sources:
            family = CounterMetricFamily(name, documentation, labels=[label])
            for value, count in sorted(read().items()):
                family.add_metric([value], count)
            yield family


#: How a gauge of several workers is merged (any other gauge: ``max``). ``sum``: a count of
#: this process's own (requests in flight, waiting); ``min``: 1 only while every worker
#: agrees (an endpoint in rotation everywhere). The rest read one shared source (the
#: exporters, the engines, the store, the config) and agree within a poll interval; ``max``
#: keeps a fault or saturation flag that one worker has already seen.
GAUGE_MERGE: Mapping[str, str] = {
    "gateway_upstream_inflight": "sum",
    "gateway_queue_depth": "sum",
    "gateway_endpoint_healthy": "min",
}
_SUMMED = frozenset({"counter", "histogram", "summary", "gaugehistogram"})

_Key = tuple[str, tuple[tuple[str, str], ...]]


def merge(snapshots: Iterable[bytes]) -> list[Metric]:
    """The families of several workers' :meth:`Metrics.snapshot` merged into one view
    (first seen, first listed): counters and histograms summed, ``_created`` the earliest,
    gauges by :data:`GAUGE_MERGE`, info and the rest the highest."""
    heads: dict[str, tuple[str, str, str]] = {}
    values: dict[str, dict[_Key, float]] = {}
    for snapshot in snapshots:
        for name, kind, documentation, unit, samples in json.loads(snapshot):
            heads.setdefault(name, (kind, documentation, unit))
            merged = values.setdefault(name, {})
            for sample_name, labels, value in samples:
                key = (sample_name, tuple(sorted(labels.items())))
                old = merged.get(key)
                merged[key] = (
                    value if old is None else _combine(kind, name, sample_name, old, value)
                )
    families = []
    for name, (kind, documentation, unit) in heads.items():
        family = Metric(name, documentation, kind, unit)
        for (sample_name, labels), value in values[name].items():
            family.add_sample(sample_name, dict(labels), value)
        families.append(family)
    return families


def _combine(kind: str, family: str, sample: str, old: float, new: float) -> float:
    if sample.endswith("_created"):
        return min(old, new)
    rule = (
        "sum" if kind in _SUMMED else GAUGE_MERGE.get(family, "max") if kind == "gauge" else "max"
    )
    if rule == "sum":
        return old + new
    if math.isnan(old):
        return new
    return min(old, new) if rule == "min" else max(old, new)


class _Fixed:
    """Families already collected, in the shape ``generate_latest`` reads."""

    def __init__(self, families: Sequence[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)
