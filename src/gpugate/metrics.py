"""Every Prometheus metric gpugate exports, declared once on the app's own registry.

This is the only module that imports ``prometheus_client``. A fresh :class:`Metrics` is built per
app (and per test), so nothing is registered globally and two gateways in one process do not
collide. Families keep the ``gateway_`` prefix (DESIGN §3).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector

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


def bounded(value: str, known: Callable[[str], bool]) -> str:
    """``value`` as a label value when ``known(value)`` (the config names it), else
    :data:`UNKNOWN`; never longer than :data:`MAX_LABEL_CHARS`."""
    return value[:MAX_LABEL_CHARS] if value == "" or known(value) else UNKNOWN


class Metrics:
    """The gateway's metric families on a private registry."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
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
        """The exposition text of every family."""
        return generate_latest(self.registry)

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
