"""The result cache of the synchronous job front: successful job results by model, operation
and a canonical hash of the input.

Opt in per model: a ``cache: {ttl_s, max_entries}`` block on the job's runner runtime, else on
the first OpenAI-compatible upstream serving the model (:func:`cache_policy`). The key is the
tenant (``auth.mode: keys``: a tenant never gets another's job, its slug or its result), the
model, the operation and the sha256 of the input as canonical JSON (sorted keys, no
whitespace), so ``{"a": 1, "b": 2}`` and ``{"b":2,"a":1}`` are one entry. Each model has its own
least-recently-used table of at most ``max_entries``; an entry lives ``ttl_s`` on the gateway's
monotonic clock. It is in-process memory, per replica: replicas do not share entries, and a
restart empties it (a miss costs one job, never a wrong answer).
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from typing import Any

from gpugate.clock import Clock
from gpugate.config import CacheConfig, GatewayConfig


def cache_key(
    model: str, operation: str, payload: dict[str, Any], tenant: str | None = None
) -> str:
    """``tenant`` + ``model`` + ``operation`` + the sha256 of ``payload`` as canonical JSON."""
    canonical = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    digest = hashlib.sha256(canonical.encode()).hexdigest()
    return f"{tenant or ''}\n{model}\n{operation}\n{digest}"


def cache_policy(config: GatewayConfig, model: str, runner: str) -> CacheConfig | None:
    """The cache block covering jobs of ``model`` on ``runner``, or None (not cached)."""
    for runtime in config.runtimes:
        covered = runtime.id == runner and model in config.runtime_models(runtime.id)
        if covered and runtime.cache is not None:
            return runtime.cache
    for upstream in config.upstreams_serving(model):
        if upstream.cache is not None:
            return upstream.cache
    return None


class ResultCache:
    """Per-model LRU tables of results with a time to live; see the module docstring."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._tables: dict[str, OrderedDict[str, tuple[float, dict[str, Any]]]] = {}
        self.hits = 0
        self.misses = 0
        self.stored = 0

    def get(self, model: str, key: str) -> dict[str, Any] | None:
        """The live entry under ``key`` (now the most recently used), or None."""
        table = self._tables.get(model)
        entry = None if table is None else table.get(key)
        if entry is None or entry[0] <= self._clock.monotonic():
            if entry is not None and table is not None:
                del table[key]
            self.misses += 1
            return None
        assert table is not None
        table.move_to_end(key)
        self.hits += 1
        return entry[1]

    def put(self, model: str, key: str, value: dict[str, Any], policy: CacheConfig) -> None:
        """Keep ``value`` for ``policy.ttl_s``; the least recently used entry beyond
        ``policy.max_entries`` leaves."""
        table = self._tables.setdefault(model, OrderedDict())
        table[key] = (self._clock.monotonic() + policy.ttl_s, value)
        table.move_to_end(key)
        while len(table) > policy.max_entries:
            table.popitem(last=False)
        self.stored += 1

    def __len__(self) -> int:
        return sum(len(table) for table in self._tables.values())

    def __repr__(self) -> str:
        return (
            f"<ResultCache entries={len(self)} hits={self.hits} misses={self.misses} "
            f"stored={self.stored}>"
        )
