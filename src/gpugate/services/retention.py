"""The retention purge (issue #15 finding 4): finished rows older than ``retention.*`` go.

Every ``retention.every_s`` (and once at start), each kind is purged in batches of
``retention.batch_rows`` rows, one short transaction each, until a batch comes back short or the
pass has run :data:`MAX_BATCHES_PER_PASS` batches (the rest waits for the next pass, so one pass
never holds the store for long): finished jobs with their events (``jobs_s``, by
``finished_at``), ended batches with their lines and files and unused uploads (``batches_s``),
audit events (``audit_s``), settled ledger entries (``jobs_s``), and expired idempotency rows
(at their own TTL, ``server.idempotency_ttl_s``). The blobs the purged rows held are deleted
after their rows (a blob without a row is harmless; a row without its blob would be an error).

Every replica runs the loop; on PostgreSQL the batches are taken ``SKIP LOCKED``, so replicas
share the work. A failing pass is logged and retried at the next one. What this process
deleted is counted on ``gateway_retention_purged_total{kind}``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING

from gpugate.errors import GpugateError
from gpugate.store.retention import Purged

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable
    from datetime import datetime

    from gpugate.adapters.blobs import BlobStore
    from gpugate.clock import Clock
    from gpugate.config import RetentionConfig
    from gpugate.metrics import Metrics
    from gpugate.store import Store

log = logging.getLogger("gpugate.retention")

MAX_BATCHES_PER_PASS = 50
KINDS = ("jobs", "batches", "audit", "ledger", "idempotency")


@dataclass
class RetentionTotals:
    """Rows (and blobs) this process purged, by kind."""

    rows: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    blobs: int = 0
    passes: int = 0
    failed_passes: int = 0


class Retention:
    """Purges old rows; see the module docstring."""

    def __init__(
        self,
        store: Store,
        blobs: BlobStore,
        clock: Clock,
        config: Callable[[], RetentionConfig],
        *,
        metrics: Metrics | None = None,
    ) -> None:
        self._store = store
        self._metrics = metrics
        self._blobs = blobs
        self._clock = clock
        self._config = config
        self.totals = RetentionTotals()

    async def run(self) -> None:
        """Purge now and every ``every_s`` until cancelled."""
        while True:
            try:
                await self.purge_once()
            except GpugateError as exc:
                self.totals.failed_passes += 1
                log.warning("retention pass failed (next in %g s): %s", self._config().every_s, exc)
            await self._clock.sleep(self._config().every_s)

    async def purge_once(self) -> dict[str, int]:
        """One pass over every kind; the rows deleted, by kind."""
        cfg = self._config()
        now = self._clock.now()
        limit = cfg.batch_rows
        store = self._store
        done = {
            "jobs": await self._batches(store.purge_jobs, _ago(now, cfg.jobs_s), limit),
            "batches": await self._batches(store.purge_batches, _ago(now, cfg.batches_s), limit),
            "audit": await self._counted(store.purge_audit, _ago(now, cfg.audit_s), limit),
            "ledger": await self._counted(store.purge_ledger, _ago(now, cfg.jobs_s), limit),
            "idempotency": await store.idem_purge_expired(),
        }
        for kind, rows in done.items():
            self.totals.rows[kind] += rows
            if self._metrics is not None and rows:
                self._metrics.retention_purged.labels(kind).inc(rows)
        self.totals.passes += 1
        if any(done.values()):
            log.info("retention purged %s", ", ".join(f"{k}={v}" for k, v in done.items() if v))
        return done

    async def _batches(
        self, purge: Callable[[datetime, int], Awaitable[Purged]], before: datetime, limit: int
    ) -> int:
        total = 0
        for _ in range(MAX_BATCHES_PER_PASS):
            purged = await purge(before, limit)
            total += purged.rows
            for key in purged.blob_keys:
                await self._blobs.delete(key)
            self.totals.blobs += len(purged.blob_keys)
            if purged.rows < limit:
                break
        return total

    async def _counted(
        self, purge: Callable[[datetime, int], Awaitable[int]], before: datetime, limit: int
    ) -> int:
        async def as_purged(cut: datetime, n: int) -> Purged:
            return Purged(await purge(cut, n))

        return await self._batches(as_purged, before, limit)

    def __repr__(self) -> str:
        return f"<Retention passes={self.totals.passes} rows={self.totals.rows}>"


def _ago(now: datetime, seconds: float) -> datetime:
    return now - timedelta(seconds=seconds)
