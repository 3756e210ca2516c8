"""The shed gate: one component that every admission site asks before admitting ``batch`` work.

Only ``batch`` is ever shed, and only when ``gpu_health.shed_batch`` is on and *every* candidate
upstream is saturated; otherwise batch goes to the candidates that are not. Each refusal is
counted exactly once in ``gateway_gpu_shed_total{site}``. Idempotent replays and cache hits are
served before the gate (they use no GPU), so they are never shed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, TypeVar

from gpugate.core.classes import RequestClass
from gpugate.errors import GpuSaturated
from gpugate.metrics import Metrics


class _Identified(Protocol):
    @property
    def id(self) -> str: ...


U = TypeVar("U", bound=_Identified)


class Saturation(Protocol):
    """What the gate asks of the GPU monitor."""

    def saturated(self, upstream_id: str) -> bool: ...


class ShedGate:
    """Sheds batch when every candidate's GPUs are saturated."""

    def __init__(self, saturation: Saturation, metrics: Metrics, *, retry_after_s: float) -> None:
        self._saturation = saturation
        self._metrics = metrics
        self._retry_after_s = retry_after_s
        self.shed = 0

    def admit(self, candidates: Sequence[U], cls: RequestClass, site: str) -> Sequence[U]:
        """The candidates ``cls`` work may use; :class:`GpuSaturated` when batch is shed."""
        if cls is not RequestClass.BATCH:
            return candidates
        fresh = [c for c in candidates if not self._saturation.saturated(c.id)]
        if fresh or not candidates:
            return fresh
        self.shed += 1
        self._metrics.gpu_shed.labels(site).inc()
        names = ", ".join(c.id for c in candidates)
        raise GpuSaturated(
            f"batch shed: the GPUs behind every candidate upstream are saturated ({names})",
            retry_after_s=self._retry_after_s,
        )

    def __repr__(self) -> str:
        return f"<ShedGate shed={self.shed}>"
