"""Active health: probe every endpoint's ``health_path`` and tell the picker what answered.

Passive health (outlier ejection on real traffic) catches failures under load; the prober catches
an endpoint that is down while idle, so no request has to pay for discovering it.
"""

from __future__ import annotations

import asyncio
import logging

from gpugate.adapters.upstream_client import UpstreamClient
from gpugate.clock import Clock
from gpugate.core import picking
from gpugate.core.picking import EndpointState
from gpugate.core.registry import Registry, UpstreamState
from gpugate.errors import UpstreamError
from gpugate.metrics import Metrics

log = logging.getLogger("gpugate.prober")


class Prober:
    """Probes each endpoint every ``interval_s``; :meth:`tick` is one round."""

    def __init__(
        self,
        registry: Registry,
        client: UpstreamClient,
        clock: Clock,
        metrics: Metrics,
        *,
        interval_s: float = 5.0,
        timeout_s: float = 2.0,
    ) -> None:
        self._registry = registry
        self._client = client
        self._clock = clock
        self._metrics = metrics
        self.interval_s = interval_s
        self._timeout_s = timeout_s
        self.rounds = 0
        self.failures = 0

    async def tick(self) -> int:
        """Probe every endpoint once, concurrently; returns how many answered healthy."""
        probes = [
            self._probe(upstream, ep)
            for upstream in self._registry.upstreams()
            for ep in upstream.endpoints
        ]
        results = await asyncio.gather(*probes)
        self.rounds += 1
        return sum(results)

    async def run(self) -> None:
        """Probe until cancelled."""
        while True:
            await self.tick()
            await self._clock.sleep(self.interval_s)

    async def _probe(self, upstream: UpstreamState, ep: EndpointState) -> bool:
        try:
            status, _ = await self._client.get(
                ep.url + upstream.config.health_path, self._timeout_s
            )
            ok = status < 500
        except UpstreamError as exc:
            ok = False
            log.debug("probe of %s failed: %s", ep.url, exc.message)
        was_down = ep.down
        picking.mark_probe_result(ep, ok, self._clock.monotonic())
        if ep.down != was_down:
            log.warning("endpoint %s of %s is %s", ep.url, upstream.id, "down" if ep.down else "up")
        if not ok:
            self.failures += 1
        in_rotation = picking.is_available(ep, self._clock.monotonic())
        index = str(upstream.endpoints.index(ep))  # its place in `urls`: no URL on /metrics
        self._metrics.endpoint_healthy.labels(upstream.id, index).set(1 if in_rotation else 0)
        return ok

    def __repr__(self) -> str:
        return f"<Prober every={self.interval_s:g}s rounds={self.rounds} failures={self.failures}>"
