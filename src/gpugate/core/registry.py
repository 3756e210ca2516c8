"""The fleet as the request path sees it: upstreams, their endpoints, their admission pools.

In memory, no I/O. Built from the config's upstreams; :meth:`Registry.reconfigure` swaps in a new
set while keeping the live state (load, health, queue) of every endpoint and upstream that stays.
A *guard* (the GPU monitor, when it is active) may take whole upstreams out of rotation.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gpugate.core.admission import AdmissionPool
from gpugate.core.picking import EjectionPolicy, EndpointState, is_available
from gpugate.errors import NoHealthyUpstream, UnknownModel, UnknownUpstream
from gpugate.retry import RetryBudget

if TYPE_CHECKING:
    from gpugate.clock import Clock
    from gpugate.config import UpstreamConfig

#: Says why an upstream is out of rotation (e.g. "GPU 1 faulted: XID 79"), or None when it is in.
Guard = Callable[[str], str | None]


@dataclass(slots=True, eq=False)
class UpstreamState:
    """One upstream: its config, its endpoints' live state and its admission pool."""

    config: UpstreamConfig
    endpoints: list[EndpointState]
    pool: AdmissionPool
    #: Retries of the sync path to this upstream stay within this budget (kept on reconfigure).
    budget: RetryBudget = field(default_factory=RetryBudget)
    #: ``config.id``, kept as a plain attribute: read several times a request, and a config
    #: model's attribute (pydantic's ``__getattr__`` hook) costs ~15 plain ones
    id: str = field(init=False)

    def __post_init__(self) -> None:
        self.id = self.config.id

    def __repr__(self) -> str:
        return f"<Upstream {self.id} endpoints={len(self.endpoints)} {self.pool!r}>"


class Registry:
    """Upstreams by id and by model, with the endpoints a request may go to."""

    def __init__(
        self,
        upstreams: Sequence[UpstreamConfig],
        clock: Clock,
        *,
        policy: EjectionPolicy | None = None,
        guard: Guard | None = None,
        processes: int = 1,
    ) -> None:
        """``processes``: the workers of ``serve --workers`` sharing each upstream, so each
        admits ``ceil(max_inflight / processes)`` and the upstream still sees ~``max_inflight``."""
        self._clock = clock
        self._processes = processes
        self._policy = policy or EjectionPolicy()
        self._by_id: dict[str, UpstreamState] = {}
        self._by_model: dict[str, list[UpstreamState]] = {}
        self._owner: dict[EndpointState, UpstreamState] = {}
        self.guard = guard
        self.reconfigure(upstreams)

    def reconfigure(self, upstreams: Sequence[UpstreamConfig]) -> None:
        """Swap in a new set of upstreams, keeping the state of what stays the same."""
        old = self._by_id
        by_id: dict[str, UpstreamState] = {}
        for cfg in upstreams:
            kept = old.get(cfg.id)
            if kept is None:
                state = UpstreamState(
                    cfg,
                    [EndpointState(cfg.id, url, self._policy) for url in cfg.endpoints],
                    AdmissionPool(self._share(cfg.max_inflight), cfg.max_queue, self._clock),
                )
            else:
                by_url = {ep.url: ep for ep in kept.endpoints}
                endpoints = [
                    by_url.get(url) or EndpointState(cfg.id, url, self._policy)
                    for url in cfg.endpoints
                ]
                kept.pool.resize(self._share(cfg.max_inflight))
                state = UpstreamState(cfg, endpoints, kept.pool, kept.budget)
            by_id[cfg.id] = state
        by_model: dict[str, list[UpstreamState]] = {}
        for state in by_id.values():
            if state.config.kind != "openai":  # reached through its own façade (azure-di)
                continue
            for model in state.config.models:
                by_model.setdefault(model, []).append(state)
        owner = {ep: state for state in by_id.values() for ep in state.endpoints}
        self._by_id, self._by_model, self._owner = by_id, by_model, owner
        self._configured = frozenset(m for state in by_id.values() for m in state.config.models)

    def _share(self, max_inflight: int) -> int:
        return -(-max_inflight // self._processes)  # ceil: never 0

    def upstream(self, upstream_id: str) -> UpstreamState:
        try:
            return self._by_id[upstream_id]
        except KeyError:
            known = ", ".join(sorted(self._by_id))
            raise UnknownUpstream(f"no upstream {upstream_id!r} (known: {known})") from None

    def owner(self, endpoint: EndpointState) -> UpstreamState:
        """The upstream ``endpoint`` belongs to."""
        return self._owner[endpoint]

    def upstreams(self) -> list[UpstreamState]:
        return list(self._by_id.values())

    def serves(self, model: str) -> bool:
        """Whether an upstream is configured for ``model`` (in rotation or not)."""
        return model in self._by_model

    def serving(self, model: str) -> list[UpstreamState]:
        """Every upstream configured for ``model``; :class:`UnknownModel` when there is none."""
        try:
            return self._by_model[model]
        except KeyError:
            raise UnknownModel(
                f"no upstream serves model {model[:100]!r}; the models served: {self._names()}"
            ) from None

    def _names(self, most: int = 20) -> str:
        """The configured models, for an error message (at most ``most`` of them)."""
        names = sorted(self._by_model)
        shown = ", ".join(names[:most])
        return shown + (f" and {len(names) - most} more" if len(names) > most else "")

    def configured(self, model: str) -> bool:
        """Whether any upstream (of any kind) names ``model``: what a metric label may say."""
        return model in self._configured

    def out_of_rotation(self, upstream: UpstreamState) -> str | None:
        """Why the guard keeps ``upstream`` out of rotation, or None."""
        return self.guard(upstream.id) if self.guard is not None else None

    def in_rotation(self, upstreams: Sequence[UpstreamState]) -> Sequence[UpstreamState]:
        """The upstreams the guard allows; :class:`NoHealthyUpstream` naming why if none."""
        if self.guard is None:
            return upstreams
        allowed = [u for u in upstreams if self.out_of_rotation(u) is None]
        if not allowed and upstreams:
            reasons = "; ".join(f"{u.id}: {self.out_of_rotation(u)}" for u in upstreams)
            raise NoHealthyUpstream(f"every upstream is out of rotation ({reasons})")
        return allowed

    def models(self, *, external: bool = True) -> list[str]:
        """Models with at least one endpoint a request could go to now (``external=False``:
        one of an upstream that is not ``external``)."""
        now = self._clock.monotonic()
        return sorted(
            model
            for model, states in self._by_model.items()
            if any(
                (external or not u.config.external)
                and self.out_of_rotation(u) is None
                and any(is_available(ep, now) for ep in u.endpoints)
                for u in states
            )
        )

    def __repr__(self) -> str:
        return f"<Registry upstreams={len(self._by_id)} models={len(self._by_model)}>"
