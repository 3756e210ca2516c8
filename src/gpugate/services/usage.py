"""Usage per client key, model and upstream: counted in memory, written in batches.

Every response through a client key adds its tokens here: a few additions to the sums of its
key, model, upstream and UTC day. The sums are priced (cents) when they are written, at the
model's ``price`` then: a cost is linear in the tokens, so a sum's is the sum of its answers'
(a price changed within one flush period prices that period's answers at the new one). A loop
writes the sums to the store every ``auth.usage_flush_s`` (default 1 s) and once more when the
gateway stops, and adds them to ``gateway_tokens_total`` as it does, so the hot path never waits
on the store for usage nor takes a metric's lock (the counter trails the answers by at most that
period). What is held in memory is bounded by keys x models x upstreams x days.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

from gpugate.clock import Clock
from gpugate.config import GatewayConfig
from gpugate.core.keys import Principal
from gpugate.core.limits import Price
from gpugate.errors import GpugateError
from gpugate.metrics import Metrics
from gpugate.services.limits import prices_of
from gpugate.store import Store
from gpugate.store.keys import UsageRow

log = logging.getLogger("gpugate.usage")

PURGE_EVERY_S = 3600.0
COUNTERS_KEPT = timedelta(days=2)  # a day's counter must outlive its day


@dataclass(slots=True)
class _Sum:
    prefix: str = ""  # the key's, for the per-key counter (``auth.key_label``)
    requests: int = 0
    prompt: int = 0
    completion: int = 0
    cents: float = 0.0


def _add(into: dict[tuple[date, str, str, str, str], _Sum], where: Any, s: _Sum) -> None:
    again = into.get(where)
    if again is None:
        again = into[where] = _Sum(prefix=s.prefix)
    again.requests += s.requests
    again.prompt += s.prompt
    again.completion += s.completion
    again.cents += s.cents


class UsageMeter:
    """Adds usage up and writes it to the store."""

    def __init__(
        self,
        store: Store,
        clock: Clock,
        metrics: Metrics,
        config: Callable[[], GatewayConfig],
        prices: Callable[[str], Price | None] | None = None,
    ) -> None:
        self._store = store
        self._clock = clock
        self._metrics = metrics
        self._config = config
        self._prices = prices_of(config) if prices is None else prices
        self._pending: dict[tuple[date, str, str, str, str], _Sum] = {}  # not yet metered
        self._unwritten: dict[tuple[date, str, str, str, str], _Sum] = {}  # a failed write's
        self._counters: dict[tuple[str, str], tuple[Any, Any]] = {}
        self._day = date.min
        self._day_ends = -math.inf  # the first record reads the day

    def record(
        self,
        principal: Principal,
        model: str,
        upstream: str,
        prompt_tokens: int,
        completion_tokens: int,
    ) -> None:
        """One answer's usage (priced at the flush)."""
        key = principal.key
        if self._clock.monotonic() >= self._day_ends:
            self._new_day()
        where = (self._day, key.id, key.tenant, model, upstream)
        entry = self._pending.get(where)
        if entry is None:  # not setdefault: that builds a _Sum on every request
            entry = self._pending[where] = _Sum(prefix=key.prefix)
        entry.requests += 1
        entry.prompt += prompt_tokens
        entry.completion += completion_tokens

    def _new_day(self) -> None:
        """The UTC day the next records count in, and when it ends (on the monotonic clock:
        one clock read per record, not a datetime)."""
        now = self._clock.now()
        self._day = now.date()
        midnight = datetime.combine(self._day + timedelta(days=1), time(), tzinfo=UTC)
        self._day_ends = self._clock.monotonic() + (midnight - now).total_seconds()

    def _meter(self, pending: dict[tuple[date, str, str, str, str], _Sum]) -> None:
        """Add newly recorded sums to ``gateway_tokens_total`` (and, with ``auth.key_label``,
        to the per-key counter)."""
        by_key = self._config().auth.key_label
        for (_day, _key_id, tenant, model, _upstream), s in pending.items():
            counters = self._counters.get((tenant, model))
            if counters is None:  # bounded: tenants x configured models
                family = self._metrics.tokens
                counters = self._counters[(tenant, model)] = (
                    family.labels(tenant, model, "prompt"),
                    family.labels(tenant, model, "completion"),
                )
            counters[0].inc(s.prompt)
            counters[1].inc(s.completion)
            if by_key:
                self._metrics.tokens_by_key.labels(s.prefix, "prompt").inc(s.prompt)
                self._metrics.tokens_by_key.labels(s.prefix, "completion").inc(s.completion)

    async def flush(self) -> int:
        """Write what was counted since the last flush (and what a failed one kept); the rows
        written."""
        pending, self._pending = self._pending, {}
        prices = self._prices
        for (_day, _key_id, _tenant, model, _upstream), s in pending.items():
            price = prices(model) if model else None
            if price is not None:
                s.cents = price.cents(s.prompt, s.completion)
        self._meter(pending)  # counted once, whether or not the store takes it now
        unwritten, self._unwritten = self._unwritten, {}
        for where, s in unwritten.items():
            _add(pending, where, s)
        rows = [
            UsageRow(
                day, key_id, tenant, model, upstream, s.requests, s.prompt, s.completion, s.cents
            )
            for (day, key_id, tenant, model, upstream), s in pending.items()
        ]
        if not rows:
            return 0
        try:
            await self._store.add_usage(rows)
        except GpugateError as exc:
            log.warning("usage not written (kept for the next flush): %s", exc.message)
            for where, s in pending.items():
                _add(self._unwritten, where, s)
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
            if self._pending or self._unwritten:
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
        return f"<UsageMeter pending={len(self._pending)} unwritten={len(self._unwritten)}>"
