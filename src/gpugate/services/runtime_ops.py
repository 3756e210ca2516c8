"""The operator's verbs and view of runtimes: enable / disable / drain, and each runtime's detail.

The states live in the store (:mod:`gpugate.store.runtime_state`); this service keeps the last
read of them in memory so the dispatcher's synchronous view of the runtimes
(:meth:`RuntimeOps.excluded`) costs nothing, writes through at once on this replica, and re-reads
them every ``server.config_poll_s`` (:meth:`run`) so a change made on another replica takes
effect here within one poll. A disabled or drained runtime takes no new dispatch. A drained
one — or one the gateway disabled itself (a stop condition: disabled *and* drained) — also loses
its calls in flight: the reaper cancels them on its next poll and their jobs walk on
(:meth:`RuntimeOps.draining`). An operator's plain ``disable`` lets calls in flight finish.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from gpugate.core.jobs import reaches
from gpugate.errors import GpugateError, UnknownRuntime
from gpugate.store import JobStore
from gpugate.store.runtime_state import (
    DISABLED,
    DRAINED,
    ENABLED,
    LastSubmit,
    RuntimeState,
    RuntimeStateStore,
    is_automatic,
    runtime_subject,
    state_action,
)

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Collection
    from datetime import datetime

    from gpugate.clock import Clock
    from gpugate.config import GatewayConfig, RuntimeConfig
    from gpugate.core.registry import Registry
    from gpugate.services.guardrails import Spend
    from gpugate.store import AuditRecord

log = logging.getLogger("gpugate.runtimes")


class OpsStore(JobStore, RuntimeStateStore, Protocol):
    """The slice of the store runtime operations use: the runtimes' states, their queues and
    calls, and their audit trail."""

    async def list_audit(
        self,
        *,
        action: str | None = None,
        subject: str | None = None,
        limit: int = 100,
        before_id: int | None = None,
        actor: str | None = None,
        since: datetime | None = None,
    ) -> list[AuditRecord]: ...


HISTORY = 20
"""How many of a runtime's latest state changes its detail shows."""


@dataclass(frozen=True, slots=True)
class RuntimeDetail:
    """One runtime as an operator sees it (``GET /admin/runtimes/{id}``).

    ``reachable`` is None where nothing probes the runtime yet (push, modal). ``spend`` is
    None where no spend is read (no guardrails wired).
    """

    config: RuntimeConfig
    state: RuntimeState | None  # None: never changed, enabled
    implemented: bool
    reachable: bool | None
    queue_depth: int
    in_flight: int
    last_submit: LastSubmit | None
    history: list[AuditRecord] = field(default_factory=list)
    spend: Spend | None = None

    @property
    def operator_state(self) -> str:
        return ENABLED if self.state is None else self.state.state

    @property
    def takes_dispatch(self) -> bool:
        """Whether the dispatcher may send it new work (config and operator both allow it)."""
        return self.config.enabled and self.operator_state == ENABLED and self.implemented

    @property
    def auto_disables(self) -> list[AuditRecord]:
        """The times the gateway disabled it on its own (stop conditions), newest first."""
        action = state_action(DISABLED)
        return [e for e in self.history if e.action == action and is_automatic(e.actor)]


class RuntimeOps:
    """Enable / disable / drain, the states' cache the dispatcher reads, each runtime's detail."""

    def __init__(
        self,
        store: OpsStore,
        config: Callable[[], GatewayConfig],
        registry: Registry,
        implemented: Collection[str],
        clock: Clock,
        *,
        poll_s: float,
        spend_of: Callable[[str], Awaitable[Spend]] | None = None,
    ) -> None:
        self._store = store
        self._config = config
        self._registry = registry
        self._implemented = implemented
        self._clock = clock
        self._poll_s = poll_s
        self.states: dict[str, RuntimeState] = {}
        #: A runtime's spend (wiring: :meth:`Guardrails.spend`); None: not shown.
        self._spend_of = spend_of

    def excluded(self) -> frozenset[str]:
        """The runtimes an operator (or a stop condition) disabled or drained: no new dispatch."""
        return frozenset(rid for rid, s in self.states.items() if not s.takes_dispatch)

    def draining(self) -> frozenset[str]:
        """The runtimes whose calls in flight are to be cancelled: drained, or disabled by the
        gateway itself (a stop condition disables *and* drains)."""
        return frozenset(
            rid
            for rid, s in self.states.items()
            if s.state == DRAINED or (s.state == DISABLED and is_automatic(s.actor))
        )

    async def tick(self) -> None:
        """Re-read every runtime's state from the store (changes made by other replicas)."""
        self.states = await self._store.runtime_states()

    async def run(self) -> None:
        """Follow the stored states every ``poll_s``; a failed read is logged, the cache kept."""
        while True:
            await self._clock.sleep(self._poll_s)
            try:
                await self.tick()
            except GpugateError as exc:
                log.warning("cannot read the runtime states: %s", exc.message)

    async def set_state(self, runtime: str, state: str, reason: str, actor: str) -> RuntimeState:
        """Set a configured runtime's state (audited by the store in the same transaction)."""
        self.runtime_config(runtime)
        stored = await self._store.set_runtime_state(runtime, state, reason, actor)
        self.states = {**self.states, runtime: stored}
        log.info("runtime %s is %s (by %s): %s", runtime, state, actor, reason or "no reason")
        return stored

    def runtime_config(self, runtime: str) -> RuntimeConfig:
        """The configured runtime, or :class:`UnknownRuntime` naming the configured ones."""
        try:
            return self._config().runtime(runtime)
        except KeyError as exc:
            raise UnknownRuntime(exc.args[0]) from None

    def ids(self) -> list[str]:
        """The configured runtimes, in the config's order."""
        return [r.id for r in self._config().runtimes]

    async def detail(self, runtime: str, *, history: bool = True) -> RuntimeDetail:
        """Everything an operator asks of one runtime (``history``: its latest state changes)."""
        cfg = self.runtime_config(runtime)
        events = (
            await self._store.list_audit(subject=runtime_subject(runtime), limit=HISTORY)
            if history
            else []
        )
        return RuntimeDetail(
            config=cfg,
            state=self.states.get(runtime),
            implemented=runtime in self._implemented,
            reachable=self._reachable(cfg),
            queue_depth=await self._store.queue_depth(runtime),
            in_flight=await self._store.count_leased(runtime),
            last_submit=await self._store.last_submit(runtime),
            history=[e for e in events if e.action.startswith("runtime.")],
            spend=None if self._spend_of is None else await self._spend_of(runtime),
        )

    def _reachable(self, cfg: RuntimeConfig) -> bool | None:
        """An upstream runtime is reachable when a model it serves has an endpoint in rotation
        (:func:`~gpugate.core.jobs.reaches`: the walk skips it when it is not)."""
        if cfg.kind != "upstream":
            return None
        return reaches(self._config().runtime_models(cfg.id), set(self._registry.models()))

    def __repr__(self) -> str:
        return f"<RuntimeOps states={len(self.states)} excluded={sorted(self.excluded())}>"
