"""Usage per client key, model and upstream: counted in memory, written in batches.

Every response through a client key adds its tokens here (and to ``gateway_tokens_total``); a
loop writes the sums to the store every ``auth.usage_flush_s`` (default 1 s) and once more when
the gateway stops, so the hot path never waits on the store for usage. What is held in memory is
bounded by keys x models x upstreams x days.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date, timedelta
from typing import Any

from gpugate.clock import Clock
from gpugate.config import GatewayConfig
from gpugate.core.keys import Principal
from gpugate.errors import GpugateError
from gpugate.metrics import Metrics
from gpugate.store import Store
from gpugate.store.keys import UsageRow

log = logging.getLogger("gpugate.usage")

PURGE_EVERY_S = 3600.0
COUNTERS_KEPT = timedelta(days=2)  # a day's counter must outlive its day


@dataclass(slots=True)
class _Sum:
    requests: int = 0
    prompt: int = 0
    completion: int = 0
    cents: float = 0.0


class UsageMeter:
    """Adds usage up and writes it to the store."""

    def __init__(
        self,
        store: Store,
        clock: Clock,
        metrics: Metrics,
        config: Callable[[], GatewayConfig],
    ) -> None:
        self._store = store
        self._clock = clock
        self._metrics = metrics
        self._config = config
        self._pending: dict[tuple[date, str, str, str, str], _Sum] = {}
        self._counters: dict[tuple[str, str], tuple[Any, Any]] = {}

    def record(
        self,
        principal: Principal,
        model: str,
        upstream: str,
        prompt_tokens: int,
        completion_tokens: int,
        cents: float,
    ) -> None:
        key = principal.key
        day = self._clock.now().date()
        where = (day, key.id, key.tenant, model, upstream)
        entry = self._pending.get(where)
        if entry is None:  # not setdefault: that builds a _Sum on every request
            entry = self._pending[where] = _Sum()
        entry.requests += 1
        entry.prompt += prompt_tokens
        entry.completion += completion_tokens
        entry.cents += cents
        counters = self._counters.get((key.tenant, model))
        if counters is None:  # bounded: tenants x configured models
            family = self._metrics.tokens
            counters = self._counters[(key.tenant, model)] = (
                family.labels(key.tenant, model, "prompt"),
                family.labels(key.tenant, model, "completion"),
            )
        counters[0].inc(prompt_tokens)
        counters[1].inc(completion_tokens)
        if self._config().auth.key_label:
            self._metrics.tokens_by_key.labels(key.prefix, "prompt").inc(prompt_tokens)
            self._metrics.tokens_by_key.labels(key.prefix, "completion").inc(completion_tokens)

    async def flush(self) -> int:
        """Write what was counted since the last flush; the rows written."""
        pending, self._pending = self._pending, {}
        rows = [
            UsageRow(
                day, key_id, tenant, model, upstream, s.requests, s.prompt, s.completion, s.cents
            )
            for (day, key_id, tenant, model, upstream), s in pending.items()
        ]
        try:
            await self._store.add_usage(rows)
        except GpugateError as exc:
            log.warning("usage not written (kept for the next flush): %s", exc.message)
            for where, s in pending.items():
                again = self._pending.setdefault(where, _Sum())
                again.requests += s.requests
                again.prompt += s.prompt
                again.completion += s.completion
                again.cents += s.cents
            return 0
        return len(rows)

    async def run(self) -> None:
        """Flush every ``auth.usage_flush_s``; once an hour, purge the key counters of windows
        older than two days (one row per key and minute would otherwise grow without end)."""
        purged_at = self._clock.monotonic()
        try:
            while True:
                await self._clock.sleep(self._config().auth.usage_flush_s)
                await self.flush()
                if self._clock.monotonic() - purged_at >= PURGE_EVERY_S:
                    purged_at = self._clock.monotonic()
                    await self.purge()
        finally:
            if self._pending:
                await self.flush()

    async def purge(self) -> int:
        """Delete the limit counters of windows older than :data:`COUNTERS_KEPT`, and the
        owner rows of jobs, batches and files no longer stored."""
        try:
            purged = await self._store.purge_counters(self._clock.now() - COUNTERS_KEPT)
            return purged + await self._store.purge_orphan_owners()
        except GpugateError as exc:
            log.warning("key counters not purged: %s", exc.message)
            return 0

    def __repr__(self) -> str:
        return f"<UsageMeter pending={len(self._pending)}>"
