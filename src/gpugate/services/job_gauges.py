"""The per-runtime job gauges: queue depth and calls in flight, read from the store (so they
count every replica's work) every ``interval_s`` — never on a request's path."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from gpugate.clock import Clock
from gpugate.errors import StoreError
from gpugate.metrics import Metrics
from gpugate.store import JobStore

log = logging.getLogger("gpugate.job_gauges")


class RuntimeGauges:
    """Refreshes ``gateway_runtime_queue_depth`` and ``gateway_runtime_in_flight``."""

    def __init__(
        self,
        store: JobStore,
        runtime_ids: Callable[[], Iterable[str]],
        metrics: Metrics,
        clock: Clock,
        *,
        interval_s: float = 5.0,
    ) -> None:
        self._store = store
        self._runtime_ids = runtime_ids
        self._metrics = metrics
        self._clock = clock
        self._interval_s = interval_s
        self._shown: set[str] = set()

    async def tick(self) -> None:
        """Read each configured runtime's figures once; drop the series of removed ones."""
        ids = set(self._runtime_ids())
        for runtime in sorted(ids):
            depth = await self._store.queue_depth(runtime)
            in_flight = await self._store.count_leased(runtime)
            self._metrics.runtime_queue_depth.labels(runtime).set(depth)
            self._metrics.runtime_in_flight.labels(runtime).set(in_flight)
        for gone in self._shown - ids:
            self._metrics.runtime_queue_depth.remove(gone)
            self._metrics.runtime_in_flight.remove(gone)
        self._shown = ids

    async def run(self) -> None:
        while True:
            try:
                await self.tick()
            except StoreError:
                log.warning("job gauges: the store failed; trying again in %s s", self._interval_s)
            await self._clock.sleep(self._interval_s)

    def __repr__(self) -> str:
        return f"<RuntimeGauges runtimes={len(self._shown)} every {self._interval_s} s>"
