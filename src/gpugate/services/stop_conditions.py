"""Stop conditions (DESIGN §2 ``stop_conditions``): the gateway disables and drains a runtime.

A condition fires from where it is seen — the dispatcher (``auth_error``: a 401/403 on submit;
``max_submits``: a job submitted ``max_submits_per_job`` times) and the reaper (``max_stuck``:
more than ``max_stuck`` stuck calls on one runtime) — and comes here (:meth:`StopConditions.fire`):

* the runtime is set ``disabled`` with the reason, by actor ``gateway:<condition>``, which
  writes its audit event in the same transaction (:meth:`RuntimeOps.set_state`);
* ``gateway_runtime_auto_disabled_total{reason=<condition>}`` counts it;
* it is drained: it takes no new dispatch from this moment (the runtime views exclude it), and
  the reaper cancels its calls in flight on its next poll and sends their jobs on along the
  chain (:meth:`RuntimeOps.draining`).

A runtime already disabled or drained is left as it is (no second event). An operator brings
it back with ``gpugate runtimes enable <id>`` (or ``POST /admin/runtimes/{id}/enable``).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from gpugate.store.runtime_state import AUTO_ACTOR, DISABLED

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from gpugate.config import GatewayConfig
    from gpugate.metrics import Metrics
    from gpugate.services.runtime_ops import RuntimeOps

log = logging.getLogger("gpugate.stop_conditions")

CONDITIONS = ("auth_error", "max_submits", "max_stuck")
"""Every stop condition, as named in the actor (``gateway:<condition>``) and the metric."""


class StopConditions:
    """Disables and drains a runtime when a stop condition fires; see the module docstring."""

    def __init__(
        self, ops: RuntimeOps, config: Callable[[], GatewayConfig], metrics: Metrics
    ) -> None:
        self._ops = ops
        self._config = config
        self._metrics = metrics
        self.fired: dict[str, int] = {}
        self._stuck_seen: dict[str, int] = {}

    async def fire(self, runtime: str, condition: str, reason: str) -> bool:
        """Disable and drain ``runtime`` for ``condition``; False when it was already stopped
        (or is not configured)."""
        if condition not in CONDITIONS:
            raise ValueError(f"unknown stop condition {condition!r}: expected one of {CONDITIONS}")
        if runtime in self._ops.excluded() or runtime not in self._ops.ids():
            return False
        await self._ops.set_state(runtime, DISABLED, reason, f"{AUTO_ACTOR}:{condition}")
        self._metrics.runtime_auto_disabled.labels(condition).inc()
        self.fired[condition] = self.fired.get(condition, 0) + 1
        log.error(
            "stop condition %s: runtime %s disabled and drained: %s", condition, runtime, reason
        )
        return True

    async def check_stuck(self, stuck_by_runtime: Mapping[str, int]) -> None:
        """``max_stuck``: a runtime with more stuck calls (the reaper's count, since it last
        fired for that runtime) than that is stopped; its count starts again from there, so it
        does not fire again the moment an operator enables the runtime."""
        limit = self._config().stop_conditions.max_stuck
        for runtime, stuck in stuck_by_runtime.items():
            since = stuck - self._stuck_seen.get(runtime, 0)
            if since > limit:
                self._stuck_seen[runtime] = stuck
                await self.fire(runtime, "max_stuck", f"{since} stuck calls (max_stuck {limit})")

    def __repr__(self) -> str:
        return f"<StopConditions fired={self.fired}>"
