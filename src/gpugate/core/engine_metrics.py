"""A model server's own metrics → one :class:`EngineReading` per endpoint (pure).

The engine monitor scrapes ``/metrics`` of each endpoint and hands the parsed samples here.
Known engines and the names read (summed over ``engine=``/data-parallel ranks, any model):

=========  ==============================  ============================  ====================
engine     running / waiting               KV use (0..1)                 prefix-cache hits
=========  ==============================  ============================  ====================
vLLM v1    ``vllm:num_requests_running``,  ``vllm:kv_cache_usage_perc``  ``vllm:prefix_cache_
           ``vllm:num_requests_waiting``   (v0: ``gpu_cache_usage_perc``) hits_total`` /
                                                                          ``queries_total``
SGLang     ``sglang:num_running_reqs``,    ``sglang:token_usage``        ``sglang:cache_hit_
           ``sglang:num_queue_reqs``                                     rate``
TEI        ``te_batch_current_size``,      —                             —
           ``te_queue_size``
=========  ==============================  ============================  ====================

LoRA: ``vllm:lora_requests_info`` (labels ``running_lora_adapters``, ``waiting_lora_adapters``,
comma-separated, and ``max_lora``; the newest sample wins). A value that is NaN or infinite is
missing, never a number; a series that is absent is unknown (None), never 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from gpugate.errors import NoEngineSeries

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence

    from gpugate.core.gpu.dcgm import Sample  # the shape of a parsed sample, any exporter's

Kind = Literal["vllm", "sglang", "tei"]

_NAMES: dict[Kind, dict[str, tuple[str, ...]]] = {
    "vllm": {
        "running": ("vllm:num_requests_running",),
        "waiting": ("vllm:num_requests_waiting",),
        "kv": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
        "hits": ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"),
        "queries": ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"),
    },
    "sglang": {
        "running": ("sglang:num_running_reqs",),
        "waiting": ("sglang:num_queue_reqs",),
        "kv": ("sglang:token_usage",),
        "hit_rate": ("sglang:cache_hit_rate",),
    },
    "tei": {"running": ("te_batch_current_size",), "waiting": ("te_queue_size",)},
}
LORA_INFO = "vllm:lora_requests_info"
#: Every sample name this module reads: the parser builds no other samples.
NAMES = frozenset(
    {name for kind in _NAMES.values() for names in kind.values() for name in names} | {LORA_INFO}
)


@dataclass(frozen=True, slots=True)
class Counters:
    """Cumulative prefix-cache counters (tokens) of one scrape, to difference against the next."""

    hits: float
    queries: float


@dataclass(frozen=True, slots=True)
class EngineReading:
    """What one scrape of one endpoint said; None where the engine does not say."""

    kind: Kind
    running: float | None
    waiting: float | None
    kv_usage: float | None
    prefix_hit_rate: float | None  # since the previous scrape (vLLM), or the engine's own
    lora_running: frozenset[str] = frozenset()
    lora_waiting: frozenset[str] = frozenset()
    max_lora: int | None = None
    counters: Counters | None = None

    @property
    def loras(self) -> frozenset[str]:
        """Adapters resident as far as the engine shows: those of running and waiting requests."""
        return self.lora_running | self.lora_waiting


@dataclass(frozen=True, slots=True)
class EngineSignal:
    """A fresh reading of one endpoint, and gpugate's outstanding count when it was taken."""

    reading: EngineReading
    outstanding_then: int
    age_s: float


def detect(samples: Iterable[Sample]) -> Kind | None:
    """Which engine wrote these samples, by its metric names (None: none known)."""
    for sample in samples:
        name = sample.name
        if name.startswith("vllm:"):
            return "vllm"
        if name.startswith("sglang:"):
            return "sglang"
        if name.startswith("te_"):
            return "tei"
    return None


def reading(
    samples: Sequence[Sample], kind: Kind | None = None, previous: EngineReading | None = None
) -> EngineReading:
    """The reading of one scrape; ``kind`` None: detected. ``previous`` gives vLLM's hit rate.

    Raises :class:`~gpugate.errors.NoEngineSeries` when the engine's running and waiting series
    are both absent.
    """
    kind = kind or detect(samples)
    if kind is None:
        raise NoEngineSeries("no vLLM, SGLang or TEI series in the scrape")
    names = _NAMES[kind]
    sums = _sums(samples, names)
    running, waiting = sums.get("running"), sums.get("waiting")
    if running is None and waiting is None:
        raise NoEngineSeries(f"no {kind} running or waiting series in the scrape")
    kv = _means(samples, names.get("kv", ()))
    counters = None
    hit_rate = sums.get("hit_rate")
    if kind == "vllm" and sums.get("queries") is not None:
        counters = Counters(sums.get("hits") or 0.0, sums["queries"])
        hit_rate = _rate(counters, previous.counters if previous else None)
    lora = _lora(samples)
    return EngineReading(
        kind=kind,
        running=running,
        waiting=waiting,
        kv_usage=None if kv is None else min(1.0, max(0.0, kv)),
        prefix_hit_rate=hit_rate,
        lora_running=lora[0],
        lora_waiting=lora[1],
        max_lora=lora[2],
        counters=counters,
    )


def _finite(value: float) -> bool:
    return not (math.isnan(value) or math.isinf(value))


def _sums(samples: Sequence[Sample], names: Mapping[str, tuple[str, ...]]) -> dict[str, float]:
    """Per field, the sum of the first of its names that has finite samples."""
    wanted = {name: field for field, options in names.items() for name in options}
    found: dict[str, dict[str, float]] = {}
    for sample in samples:
        field = wanted.get(sample.name)
        if field is not None and _finite(sample.value):
            by_name = found.setdefault(field, {})
            by_name[sample.name] = by_name.get(sample.name, 0.0) + sample.value
    out = {}
    for field, options in names.items():
        by_name = found.get(field, {})
        for name in options:
            if name in by_name:
                out[field] = by_name[name]
                break
    return out


def _means(samples: Sequence[Sample], names: tuple[str, ...]) -> float | None:
    for name in names:
        values = [s.value for s in samples if s.name == name and _finite(s.value)]
        if values:
            return sum(values) / len(values)
    return None


def _rate(now: Counters, before: Counters | None) -> float | None:
    """Hits per query since ``before`` (or ever, on the first scrape); None with no queries.
    A counter that went back (the engine restarted) counts from zero."""
    if before is not None and now.queries >= before.queries and now.hits >= before.hits:
        queries, hits = now.queries - before.queries, now.hits - before.hits
    else:
        queries, hits = now.queries, now.hits
    return hits / queries if queries > 0 else None


def _lora(samples: Sequence[Sample]) -> tuple[frozenset[str], frozenset[str], int | None]:
    newest: Sample | None = None
    for sample in samples:
        if sample.name == LORA_INFO and (newest is None or sample.value >= newest.value):
            newest = sample
    if newest is None:
        return frozenset(), frozenset(), None
    labels = newest.labels

    def adapters(label: str) -> frozenset[str]:
        return frozenset(a.strip() for a in labels.get(label, "").split(",") if a.strip())

    raw = labels.get("max_lora", "")
    return (
        adapters("running_lora_adapters"),
        adapters("waiting_lora_adapters"),
        int(raw) if raw.isdigit() else None,
    )
