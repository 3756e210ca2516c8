"""The monitor never raises, whatever an exporter sends; every bad scrape is counted."""

from __future__ import annotations

import asyncio

from gpu_strategies import PROFILE, mutated
from hypothesis import given
from hypothesis import strategies as st

from gpugate.adapters.upstream_client import UpstreamClient
from gpugate.clock import ManualClock
from gpugate.config import GpuHealthConfig, UpstreamConfig
from gpugate.metrics import Metrics
from gpugate.services.gpu_monitor import GpuMonitor

UPSTREAMS = [UpstreamConfig(id="u", url="http://127.0.0.1:9", models=["m"], gpu_ids=[0, 1])]


def monitor_fed(bodies: list[str | bytes]) -> GpuMonitor:
    pending = list(bodies)

    async def fetch(url: str) -> bytes:
        body = pending.pop(0)
        return body.encode() if isinstance(body, str) else body

    cfg = GpuHealthConfig(dcgm_url="http://127.0.0.1:9400/metrics")
    return GpuMonitor(cfg, UPSTREAMS, UpstreamClient(), ManualClock(), Metrics(), fetch=fetch)


@PROFILE
@given(st.lists(st.one_of(mutated(), st.text(), st.binary()), min_size=1, max_size=4))
def test_the_monitor_never_raises_on_mutated_or_random_exposition_text(
    bodies: list[str | bytes],
) -> None:
    monitor = monitor_fed(bodies)

    async def poll_all() -> int:
        return sum([await monitor.tick() for _ in bodies])

    succeeded = asyncio.run(poll_all())
    (exporter,) = monitor.exporters
    assert len(bodies) == succeeded + exporter.failures
    assert monitor.guard("u") is None or "GPU" in monitor.guard("u")
