"""Replica liveness (DESIGN §5.3): this process heartbeats into the shared store, and takes
back the leases of any replica gone silent (its dispatcher claims, their slot reservations, the
calls it ran itself), so the reaper re-queues those jobs within a minute of that replica's death
instead of after the 600 s dispatcher lease or a call's ``jobs.quiet_s``."""

from __future__ import annotations

import logging

from gpugate.clock import Clock
from gpugate.errors import StoreError
from gpugate.store.replicas import ReplicaStore

log = logging.getLogger("gpugate.replicas")


class ReplicaHeartbeat:
    """Every ``every_s``: heartbeat, then end the claims of replicas silent over ``silent_s``."""

    def __init__(
        self, store: ReplicaStore, clock: Clock, *, every_s: float = 10.0, silent_s: float = 30.0
    ) -> None:
        self._store = store
        self._clock = clock
        self._every_s = every_s
        self._silent_s = silent_s

    async def tick(self) -> list[str]:
        """One beat; the silent replicas whose claims were taken back."""
        await self._store.heartbeat()
        silent = await self._store.reclaim_silent(self._silent_s)
        if silent:
            log.warning(
                "replicas silent for over %.0f s: %s; their leases are taken back",
                self._silent_s,
                ", ".join(silent),
            )
        return silent

    async def run(self) -> None:
        while True:
            try:
                await self.tick()
            except StoreError:
                log.warning(
                    "replica heartbeat: the store failed; trying again in %s s", self._every_s
                )
            await self._clock.sleep(self._every_s)

    def __repr__(self) -> str:
        return f"<ReplicaHeartbeat {self._store.replica} every {self._every_s} s>"
