"""Routing that knows the engines: which endpoint gets a request, by cost (pure).

:func:`choose` takes one :class:`Facts` per candidate endpoint and returns the cheapest. The
cost of an endpoint is in units of "queued requests":

    load      = outstanding now                      (gpugate's own count, always fresh)
              + others' requests                     (engine running + waiting - ours when read)
              + waiting_weight * waiting             (the engine could not start them: it is full)
              + kv_weight * (kv_use - 0.9) / 0.1     (KV cache above 90 %)
                                      (the engine's terms only from a fresh reading: fail open)
    cost      = load
              + saturated_penalty              if the request is batch and its GPUs are saturated
              - prefix_weight * mine / blocks  the share of the prompt's leading blocks sent there
              - session_weight                 if it served this conversation last
              - lora_weight                    if the requested LoRA adapter is resident there

**Load-balance override:** an endpoint at least ``balance_abs`` busier than the least loaded one
and ``balance_rel`` times as busy gets no affinity credit at all (prefix, session, LoRA): a hot
prefix cannot pile a queue onto one replica. Ties go at random.

Policies: ``least_outstanding`` is wave 1's power of two choices
(:func:`gpugate.core.picking.pick`); ``engine_load`` is load (and LoRA residency) only;
``prefix_affinity`` is all of the above.
Endpoints that are not available (ejected, down, probing, already tried) never compete, one that
asked to back off (429/503) only when nothing else is left, and the
GPU guard has already taken upstreams on faulted GPUs out of the candidates (a hard filter).

:class:`Router` gathers the facts for a request — its prompt's block hashes in the
:class:`~gpugate.core.prefix_index.PrefixIndex`, its session, the engines' signals — calls
:func:`choose` and remembers where the request went (:meth:`Router.sent`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any, NamedTuple

from gpugate.config.engine import RoutingConfig
from gpugate.core import picking
from gpugate.core.prefix_index import PrefixIndex

if TYPE_CHECKING:
    import random

    from gpugate.config import UpstreamConfig
    from gpugate.config.models import ModelConfig
    from gpugate.core.engine_metrics import EngineSignal
    from gpugate.core.picking import EndpointState

_MAX_SESSION_KEY = 128  # characters of a session id kept; a longer one is hashed
_EPSILON = 1e-9
#: KV-cache use below this adds no load (an engine's cache is meant to be mostly full).
KV_PRESSURE = 0.9


class Reason(StrEnum):
    """What decided a choice (``gateway_routing_picks_total{reason}``)."""

    LOAD = "load"  # the least loaded won; affinity changed nothing
    PREFIX = "prefix"
    SESSION = "session"
    LORA = "lora"
    BALANCE = "balance"  # an endpoint with affinity was too busy: load won over it
    P2C = "p2c"  # least_outstanding


class Facts(NamedTuple):
    """One candidate endpoint as the scorer sees it (a tuple: built per candidate per request)."""

    load: float
    prefix_blocks: int = 0
    session: bool = False
    lora: bool = False
    saturated: bool = False


@dataclass(slots=True)
class Choice:
    """The chosen candidate's index in ``facts`` and what decided it (not frozen: a frozen
    dataclass's ``__init__`` goes through ``object.__setattr__``, and this is one per request)."""

    index: int
    reason: Reason


def load_of(outstanding: int, signal: EngineSignal | None, cfg: RoutingConfig) -> float:
    """An endpoint's load, in requests. gpugate's own outstanding count is the freshest signal
    (it moves with every claim and release); a fresh engine reading adds what only the engine
    knows: requests other clients sent (its running and waiting beyond what gpugate had out when
    it was read), ``waiting_weight`` per request it could not start (slots or KV cache full),
    and up to ``kv_weight`` as its KV cache fills past :data:`KV_PRESSURE`. With no fresh
    reading it is the outstanding count alone (fail open)."""
    if signal is None:
        return float(outstanding)
    r = signal.reading
    running, waiting = r.running or 0.0, r.waiting or 0.0
    others = max(0.0, running + waiting - signal.outstanding_then)
    kv = max(0.0, (r.kv_usage or 0.0) - KV_PRESSURE) / (1.0 - KV_PRESSURE)
    return outstanding + others + cfg.waiting_weight * waiting + cfg.kv_weight * kv


def choose(
    facts: Sequence[Facts],
    cfg: RoutingConfig,
    rng: random.Random,
    *,
    blocks: int = 0,
    batch: bool = False,
    affinity: bool = True,
    latencies: Sequence[float | None] = (),
) -> Choice:
    """The cheapest candidate (see the module docstring); ``blocks``: the prompt's block count.
    ``affinity`` False: load and LoRA only (``engine_load``). Ties go to the lower of
    ``latencies`` when given and known, else at random. ``facts`` must not be empty."""
    if batch:
        penalty = cfg.saturated_penalty
        loads = [f.load + penalty if f.saturated else f.load for f in facts]
    else:
        loads = [f.load for f in facts]
    least = min(loads)
    best_prefix = max([f.prefix_blocks for f in facts]) if affinity and blocks else 0
    overridden = False
    costs = loads.copy()  # less each candidate's credit, below
    for i, f in enumerate(facts):
        if best_prefix or f.lora or (affinity and f.session):  # else no credit: the load
            credit = 0.0
            if best_prefix:
                credit += cfg.prefix_weight * f.prefix_blocks / blocks
            if affinity and f.session:
                credit += cfg.session_weight
            if f.lora:
                credit += cfg.lora_weight
            if credit and _too_busy(loads[i], least, cfg):
                credit, overridden = 0.0, True
            costs[i] = loads[i] - credit
    cheapest = min(costs) + _EPSILON
    ties = [i for i, cost in enumerate(costs) if cost <= cheapest]
    if len(ties) > 1 and latencies:
        known = [v for v in (latencies[i] for i in ties) if v is not None]
        if known:
            fastest = min(known)
            ties = [i for i in ties if latencies[i] is None or latencies[i] == fastest]
    index = ties[0] if len(ties) == 1 else ties[rng.randrange(len(ties))]
    return Choice(index, _reason(facts[index], loads[index], least, overridden, blocks))


def _least_loaded(
    available: Sequence[EndpointState],
    signal_of: Callable[[str, str, float], EngineSignal | None],
    rng: random.Random,
    now: float,
) -> EndpointState | None:
    """:func:`choose`'s answer when nothing but load can decide — no prompt blocks, no session
    served before, not batch, and no engine reading (else None: ask :func:`choose`) — without
    its :class:`Facts`: the least outstanding, ties to the lower latency, then at random (the
    same draws of ``rng``). The bench's short chat turns, and any prompt under one block."""
    loads = []
    for ep in available:
        if signal_of(ep.upstream_id, ep.url, now) is not None:
            return None
        loads.append(ep.outstanding)
    least = min(loads) + _EPSILON
    ties = [i for i, load in enumerate(loads) if load <= least]
    if len(ties) > 1:
        latencies = [picking.latency(available[i], now) for i in ties]
        known = [v for v in latencies if v is not None]
        if known:
            fastest = min(known)
            ties = [i for i, v in zip(ties, latencies, strict=True) if v is None or v == fastest]
    return available[ties[0] if len(ties) == 1 else ties[rng.randrange(len(ties))]]


def _too_busy(load: float, least: float, cfg: RoutingConfig) -> bool:
    return load - least >= cfg.balance_abs and load >= cfg.balance_rel * least


def _reason(f: Facts, load: float, least: float, overridden: bool, blocks: int) -> Reason:
    if load > least + _EPSILON:  # affinity pulled the request off the least loaded endpoint
        if f.lora:
            return Reason.LORA
        if f.session and not (blocks and f.prefix_blocks):
            return Reason.SESSION
        return Reason.PREFIX if f.prefix_blocks else Reason.SESSION
    return Reason.BALANCE if overridden else Reason.LOAD


def session_key(headers: Sequence[tuple[bytes, bytes]], doc: Mapping[str, Any] | None) -> str:
    """The conversation a request belongs to: ``X-Session-Id``, else the body's ``user``; ""."""
    for name, value in headers:
        if name.lower() == b"x-session-id" and value:
            return _bounded(value.decode("latin-1"))
    user = doc.get("user") if doc is not None else None
    return _bounded(user) if isinstance(user, str) else ""


def _bounded(key: str) -> str:
    return key if len(key) <= _MAX_SESSION_KEY else f"#{hash(key):x}"


@dataclass(slots=True)
class Route:
    """One request's routing facts, computed once and kept across its tries (``policy``:
    ``cfg.policy``, read once: a config model's attribute costs ~15 plain ones)."""

    model: str
    hashes: list[int]
    session: str
    batch: bool
    cfg: RoutingConfig
    policy: str


class Router:
    """Chooses endpoints for requests and remembers where prompts and sessions went.

    ``policy(model, upstream_id)`` gives the routing config, ``signal(upstream_id, url, now)`` a
    fresh engine reading or None, ``saturated(upstream_id)`` whether its GPUs are. State is per
    model and bounded (``prefix_max_blocks`` hashes, ``max_sessions`` sessions, LRU).
    """

    def __init__(
        self,
        policy: Callable[[str, str | None], RoutingConfig],
        *,
        signal: Callable[[str, str, float], EngineSignal | None] | None = None,
        saturated: Callable[[str], bool] | None = None,
    ) -> None:
        self.policy = policy
        self.signal = signal or (lambda _upstream, _url, _now: None)
        self.saturated = saturated or (lambda _upstream: False)
        self._indexes: dict[str, PrefixIndex] = {}
        self._sessions: dict[str, OrderedDict[str, str]] = {}

    def __repr__(self) -> str:
        blocks = sum(len(i) for i in self._indexes.values())
        sessions = sum(len(s) for s in self._sessions.values())
        return f"<Router models={len(self._indexes)} blocks={blocks} sessions={sessions}>"

    def route(
        self,
        model: str,
        upstream_id: str | None,
        doc: Mapping[str, Any] | None,
        headers: Sequence[tuple[bytes, bytes]] = (),
        *,
        batch: bool = False,
    ) -> Route:
        """The facts of one request (its prompt hashed once, here)."""
        cfg = self.policy(model, upstream_id)
        policy = cfg.policy
        hashes: list[int] = []
        session = ""
        if policy == "prefix_affinity":
            hashes = self._index(model, cfg).hashes(doc)
            session = session_key(headers, doc) if cfg.max_sessions else ""
        return Route(model, hashes, session, batch, cfg, policy)

    def pick(
        self,
        route: Route,
        candidates: Sequence[EndpointState],
        rng: random.Random,
        now: float,
        *,
        exclude: Collection[str] = frozenset(),
    ) -> tuple[EndpointState, Reason]:
        """The endpoint for ``route`` among ``candidates`` (NoHealthyUpstream if none is
        available). Pure but for the random tie-break; call :meth:`sent` once it is claimed."""
        if route.policy == "least_outstanding":
            return picking.pick(candidates, rng, now, exclude=exclude), Reason.P2C
        available = [
            ep for ep in candidates if ep.url not in exclude and picking.is_available(ep, now)
        ]
        if len(available) <= 1:
            return picking.pick(candidates, rng, now, exclude=exclude), Reason.LOAD
        if any(picking.is_backed_off(ep, now) for ep in available):  # a last resort, as in pick
            available = [ep for ep in available if not picking.is_backed_off(ep, now)] or available
            if len(available) == 1:
                return available[0], Reason.LOAD
        cfg = route.cfg
        affinity = route.policy == "prefix_affinity"
        model = route.model
        sessions = self._sessions.get(model)
        last = sessions.get(route.session) if sessions is not None and route.session else None
        signal_of, saturated = self.signal, (self.saturated if route.batch else None)
        if not route.hashes and last is None and saturated is None:
            chosen = _least_loaded(available, signal_of, rng, now)
            if chosen is not None:
                return chosen, Reason.LOAD
        runs = self._index(model, cfg).match(model, route.hashes) if affinity else {}
        facts = []
        for ep in available:
            url = ep.url
            signal = signal_of(ep.upstream_id, url, now)
            if signal is None:
                load, lora = float(ep.outstanding), False
            else:
                reading = signal.reading  # its ``loras`` without building the union
                load = load_of(ep.outstanding, signal, cfg)
                lora = model in reading.lora_running or model in reading.lora_waiting
            facts.append(
                Facts(
                    load,
                    runs.get(url, 0),
                    url == last,
                    lora,
                    saturated is not None and saturated(ep.upstream_id),
                )
            )
        choice = choose(
            facts,
            cfg,
            rng,
            blocks=len(route.hashes),
            batch=route.batch,
            affinity=affinity,
            # a prompt that can be cached: the latency figure tells past cache hits, not the
            # endpoint's speed, and breaking ties on it herds new prompts onto whichever answered
            # cached ones fastest (bench/routing.py: p99 TTFT 40 -> 270 ms). Otherwise, as wave 1.
            latencies=() if route.hashes else [picking.latency(ep, now) for ep in available],
        )
        return available[choice.index], choice.reason

    def sent(self, route: Route, endpoint: EndpointState) -> None:
        """``route``'s request went to ``endpoint``: it will cache the prompt; the session
        continues there."""
        if route.policy != "prefix_affinity":
            return
        cfg = route.cfg
        self._index(route.model, cfg).record(route.model, route.hashes, endpoint.url)
        if route.session:
            sessions = self._sessions.setdefault(route.model, OrderedDict())
            sessions[route.session] = endpoint.url
            sessions.move_to_end(route.session)
            while len(sessions) > cfg.max_sessions:
                sessions.popitem(last=False)

    def forget(self, url: str) -> None:
        """``url`` left the fleet: drop it from every index."""
        for index in self._indexes.values():
            index.forget(url)

    def _index(self, model: str, cfg: RoutingConfig) -> PrefixIndex:
        index = self._indexes.get(model)
        if index is None:
            index = self._indexes[model] = PrefixIndex(
                cfg.prefix_block_chars, cfg.prefix_max_blocks
            )
        return index


def default_policy(_model: str, _upstream: str | None) -> RoutingConfig:
    return _DEFAULT


_DEFAULT = RoutingConfig()


def policy_table(
    upstreams: Sequence[UpstreamConfig],
    models: Sequence[ModelConfig] = (),
    default: RoutingConfig = _DEFAULT,
) -> Callable[[str, str | None], RoutingConfig]:
    """``policy(model, upstream_id)`` for a config: the named upstream's ``routing``, else that
    of the first upstream serving the model that has one, else the model's (``models[]``), else
    ``default``. Dict lookups."""
    by_upstream = {u.id: u.routing for u in upstreams if u.routing is not None}
    by_model = {m.name: m.routing for m in models if m.routing is not None}
    for u in reversed(upstreams):  # the first upstream with routing wins over the model's
        if u.routing is not None:
            for model in u.models:
                by_model[model] = u.routing

    def policy(model: str, upstream_id: str | None) -> RoutingConfig:
        if upstream_id is not None and upstream_id in by_upstream:
            return by_upstream[upstream_id]
        return by_model.get(model, default)

    return policy
