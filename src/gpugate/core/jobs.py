"""Where a job may run, decided without I/O: the candidate walk, the skip rules, the retries.

The dispatcher (a service) carries these decisions out; here they are values:

* :func:`candidates` — the job's runner first, then the fallback chain, de-duplicated;
* :func:`skip_reason` — why a runtime is passed over without a submit (or None);
* :class:`ChainWalk` — one walk along the candidates: :meth:`ChainWalk.next` answers
  :class:`Submit` (try this runtime), :class:`Defer` (every live candidate is at capacity or
  busy: wait) or :class:`Exhausted` (fail the job); :meth:`ChainWalk.failed` answers
  :class:`Submit` (retry once in place) or :class:`Walk` (go on to the next candidate).

A runtime is seen through a :class:`RuntimeView`: what the config says of it, plus the live
facts the dispatcher gathers (enabled, reachable, over budget, calls leased now).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Protocol

from gpugate.config import GatewayConfig

DISABLED = "disabled"
MODEL_MISMATCH = "model_mismatch"
NO_IMPLEMENTATION = "no_implementation"
UNREACHABLE = "unreachable"
OVER_BUDGET = "over_budget"
EXTERNAL_FORBIDDEN = "external_forbidden"
ATTEMPTS_SPENT = "attempts_spent"
SKIP_REASONS = (
    NO_IMPLEMENTATION,
    MODEL_MISMATCH,
    EXTERNAL_FORBIDDEN,
    DISABLED,
    UNREACHABLE,
    OVER_BUDGET,
    ATTEMPTS_SPENT,
)
"""Every reason :func:`skip_reason` gives, in the order it checks them."""

_IRRELEVANT = frozenset({NO_IMPLEMENTATION, MODEL_MISMATCH})
"""Reasons that say a runtime could never have run the job at all."""

AT_CAPACITY = "AT_CAPACITY"
CHAIN_EXHAUSTED = "CHAIN_EXHAUSTED"
EXTERNAL_UPSTREAM_FORBIDDEN = "EXTERNAL_UPSTREAM_FORBIDDEN"
GPU_SATURATED = "GPU_SATURATED"
RUNTIME_DRAINED = "RUNTIME_DRAINED"
"""The attempt failure of a call cancelled because its runtime was drained (or auto-disabled)."""
SUBMIT_LIMIT = "SUBMIT_LIMIT"
"""A job submitted ``stop_conditions.max_submits_per_job`` times is not submitted again."""
RUNTIME_BUSY = "RUNTIME_BUSY"
"""The deferral of a job a runtime refused as busy (429): it waits with backoff, not failed."""
BUSY_DEADLINE = "BUSY_DEADLINE"
"""A job that found no room past ``jobs.busy_deadline_s`` after it was created fails."""


class JobFacts(Protocol):
    """What the walk reads of a job (a stored job record has all of it)."""

    @property
    def model(self) -> str: ...

    @property
    def runner(self) -> str: ...

    @property
    def allow_external(self) -> bool: ...

    @property
    def attempts(self) -> Mapping[str, int]: ...


@dataclass(frozen=True, slots=True)
class RuntimeView:
    """One runtime as the walk sees it.

    ``models`` None means any model. ``external``: every call leaves the building (serverless);
    ``external_models``: models this runtime could only send to an external upstream.
    ``reachable`` False: nothing it serves can be reached now; ``unreachable_models``: models it
    cannot reach now although others it serves can (an ``upstream`` runtime whose model has no
    endpoint in rotation). ``leased`` counts the runtime's calls in flight, across replicas;
    with ``max_concurrency`` None there is no limit; ``configured_max``: the config's
    ``max_concurrency`` when the limit in effect is lower, learned from the runtime's 429s.
    """

    id: str
    kind: str
    models: frozenset[str] | None = None
    enabled: bool = True
    implemented: bool = True
    reachable: bool = True
    over_budget: bool = False
    external: bool = False
    max_concurrency: int | None = None
    leased: int = 0
    external_models: frozenset[str] = field(default_factory=frozenset)
    unreachable_models: frozenset[str] = field(default_factory=frozenset)
    configured_max: int | None = None

    @property
    def at_capacity(self) -> bool:
        """Whether a new call would exceed ``max_concurrency``."""
        return self.max_concurrency is not None and self.leased >= self.max_concurrency

    def forbids(self, model: str) -> bool:
        """Whether a job that may not leave the building must not go here with ``model``."""
        return self.external or self.kind == "modal" or model in self.external_models


def candidates(runner: str, chain: Iterable[str]) -> list[str]:
    """The job's runner first, then the fallback chain, each runtime once."""
    return list(dict.fromkeys([runner, *chain]))


def skip_reason(
    job: JobFacts,
    runtime: str,
    view: RuntimeView | None,
    *,
    max_attempts: int | None = None,
) -> str | None:
    """Why ``runtime`` is passed over for ``job`` without a submit, or None to try it.

    The reasons (:data:`SKIP_REASONS`) are checked in that order, so a runtime that could never
    have served the job says so before anything about its current state. ``max_attempts``
    (per runtime) makes a runtime whose attempts at this job are spent a skip too.
    """
    if view is None or not view.implemented:
        return NO_IMPLEMENTATION
    spent = max_attempts is not None and job.attempts.get(runtime, 0) >= max_attempts
    checks = (
        (MODEL_MISMATCH, view.models is not None and job.model not in view.models),
        (EXTERNAL_FORBIDDEN, not job.allow_external and view.forbids(job.model)),
        (DISABLED, not view.enabled),
        (UNREACHABLE, not view.reachable or job.model in view.unreachable_models),
        (OVER_BUDGET, view.over_budget),
        (ATTEMPTS_SPENT, spent),
    )
    return next((reason for reason, applies in checks if applies), None)


@dataclass(frozen=True, slots=True)
class Submit:
    """Submit the job to ``runtime`` (again, when it is a retry in place)."""

    runtime: str


@dataclass(frozen=True, slots=True)
class Walk:
    """Give up on ``runtime`` for this walk and go on to the next candidate."""

    runtime: str
    error: str


@dataclass(frozen=True, slots=True)
class Defer:
    """Put the job back in the queue until ``not_before``; it has not failed. ``why``: what
    kept each candidate from taking it (:meth:`ChainWalk.why`), for the ``deferred`` event."""

    reason: str
    not_before: datetime
    why: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Exhausted:
    """No candidate is left: fail the job with ``code``; ``errors`` holds each runtime's last
    error (or why it was skipped), in walk order."""

    code: str
    errors: dict[str, str]

    @property
    def message(self) -> str:
        """Every runtime's last error, on one line."""
        if not self.errors:
            return "no runtime to try: the chain is empty"
        return "; ".join(f"{runtime}: {error}" for runtime, error in self.errors.items())


def at_capacity_until(
    now: datetime,
    backoff_s: float,
    reason: str = AT_CAPACITY,
    why: dict[str, str] | None = None,
) -> Defer:
    """The deferral of a job whose every live candidate is at capacity (or refused it busy)."""
    return Defer(reason, now + timedelta(seconds=backoff_s), why or {})


def saturated_until(now: datetime, backoff_s: float, why: dict[str, str] | None = None) -> Defer:
    """The deferral of a job shed because the GPUs are saturated."""
    return Defer(GPU_SATURATED, now + timedelta(seconds=backoff_s), why or {})


def capacity_reason(view: RuntimeView) -> str:
    """Why a runtime at capacity was passed over, as a walk's reasons read: ``AT_CAPACITY:
    2 of 2 calls in flight``, and when the limit was learned lower than ``max_concurrency``,
    ``AT_CAPACITY: 1 of 1 calls in flight (a limit learned from its 429s; max_concurrency 2)``."""
    why = f"{AT_CAPACITY}: {view.leased} of {view.max_concurrency} calls in flight"
    if view.configured_max is not None and view.configured_max != view.max_concurrency:
        why += f" (a limit learned from its 429s; max_concurrency {view.configured_max})"
    return why


class ChainWalk:
    """One walk of one job along its candidates; holds what happened, decides what is next.

    ``now`` and ``capacity_backoff_s`` date a :class:`Defer`; ``max_attempts`` is the per-runtime
    limit of submits plus failed attempts (the job's stored count, plus this walk's failures).
    A runtime that refused the submit as busy (429) is no failed attempt: the job is deferred
    ``RUNTIME_BUSY`` for ``busy_backoff_s`` (the dispatcher's jittered backoff) — unless the
    walk runs past ``busy_deadline``, when the job fails ``BUSY_DEADLINE`` instead.
    """

    def __init__(  # noqa: PLR0913 - the job, its chain and views, then keyword-only knobs
        self,
        job: JobFacts,
        chain: Sequence[str],
        views: Mapping[str, RuntimeView],
        *,
        now: datetime,
        max_attempts: int,
        capacity_backoff_s: float,
        busy_backoff_s: float | None = None,
        busy_deadline: datetime | None = None,
    ) -> None:
        self._job = job
        self._views = views
        self._now = now
        self._max_attempts = max_attempts
        self._backoff_s = capacity_backoff_s
        self._busy_backoff_s = capacity_backoff_s if busy_backoff_s is None else busy_backoff_s
        self._busy_deadline = busy_deadline
        self.order = candidates(job.runner, chain)
        self._next = 0
        self._attempts = dict(job.attempts)
        self._retried: set[str] = set()
        self.skipped: dict[str, str] = {}
        self.errors: dict[str, str] = {}
        self.full: dict[str, str] = {}  # passed over at capacity: why (capacity_reason)
        self.busy: list[str] = []
        self.refusals: list[str] = []  # runtimes that answered busy (429) in this walk

    def next(self) -> Submit | Defer | Exhausted:
        """The next runtime to submit to, or how the walk ends."""
        while self._next < len(self.order):
            runtime = self.order[self._next]
            self._next += 1
            view = self._views.get(runtime)
            facts = _WithAttempts(self._job, self._attempts)
            reason = skip_reason(facts, runtime, view, max_attempts=self._max_attempts)
            if reason is not None:
                self.skipped[runtime] = reason
                continue
            assert view is not None
            if view.at_capacity:
                self._full(runtime, view)
                continue
            return Submit(runtime)
        return self._end()

    def refused(self, runtime: str, *, over_budget: bool) -> None:
        """The reservation before a submit to ``runtime`` was refused: no room in today's budget
        (a skip, :data:`OVER_BUDGET`) or no free call slot (like a runtime at capacity)."""
        if over_budget:
            self.skipped[runtime] = OVER_BUDGET
        else:
            view = self._views.get(runtime)
            assert view is not None, "a refused runtime was submitted to: it has a view"
            self._full(runtime, view)

    def _full(self, runtime: str, view: RuntimeView) -> None:
        self.busy.append(runtime)
        self.full[runtime] = capacity_reason(view)

    def why(self, runtime: str) -> str:
        """Why ``runtime`` did not take the job in this walk: its last error, why it was
        skipped, or that it was at capacity; ``not tried`` for one the walk did not reach."""
        return (
            self.errors.get(runtime)
            or self.skipped.get(runtime)
            or self.full.get(runtime)
            or "not tried"
        )

    def reasons(self) -> dict[str, str]:
        """:meth:`why` of every candidate the walk reached, in walk order."""
        return {runtime: self.why(runtime) for runtime in self.order[: self._next]}

    def failed(
        self, runtime: str, error: str, *, retryable: bool, busy: bool = False
    ) -> Submit | Walk:
        """A submit to ``runtime`` failed: retry once in place (retryable, attempts left) or walk.

        ``busy`` marks a runtime that refused for lack of room (429, issue #14 defect 3): no
        attempt is spent and it is not retried at once; if the walk finds no home for the job,
        it is deferred with backoff rather than failed.
        """
        self.errors[runtime] = error
        if busy:
            self.busy.append(runtime)
            self.refusals.append(runtime)
            return Walk(runtime, error)
        self._attempts[runtime] = self._attempts.get(runtime, 0) + 1
        if (
            retryable
            and runtime not in self._retried
            and self._attempts[runtime] < self._max_attempts
        ):
            self._retried.add(runtime)
            return Submit(runtime)
        return Walk(runtime, error)

    def _end(self) -> Defer | Exhausted:
        if self.busy:
            if self._busy_deadline is not None and self._now >= self._busy_deadline:
                waited = {r: self.why(r) for r in self.busy}
                return Exhausted(
                    BUSY_DEADLINE,
                    {r: f"busy past the deadline ({why})" for r, why in waited.items()},
                )
            why = self.reasons()
            if self.refusals:
                return at_capacity_until(self._now, self._busy_backoff_s, RUNTIME_BUSY, why)
            return at_capacity_until(self._now, self._backoff_s, why=why)
        relevant = {r: why for r, why in self.skipped.items() if why not in _IRRELEVANT}
        if (
            not self.errors
            and relevant
            and all(why == EXTERNAL_FORBIDDEN for why in relevant.values())
        ):
            forbidden = dict.fromkeys(relevant, "skipped (external_forbidden)")
            return Exhausted(EXTERNAL_UPSTREAM_FORBIDDEN, forbidden)
        errors = {
            runtime: self.errors.get(runtime) or f"skipped ({self.skipped.get(runtime, '?')})"
            for runtime in self.order
        }
        return Exhausted(CHAIN_EXHAUSTED, errors)

    def __repr__(self) -> str:
        return (
            f"<ChainWalk order={self.order} skipped={len(self.skipped)} "
            f"failed={len(self.errors)} busy={len(self.busy)}>"
        )


@dataclass(frozen=True, slots=True)
class _WithAttempts:
    """A job's facts with this walk's attempt counts."""

    job: JobFacts
    counts: Mapping[str, int]

    @property
    def model(self) -> str:
        return self.job.model

    @property
    def runner(self) -> str:
        return self.job.runner

    @property
    def allow_external(self) -> bool:
        return self.job.allow_external

    @property
    def attempts(self) -> Mapping[str, int]:
        return self.counts


@dataclass(slots=True)
class LearnedConcurrency:
    """How many calls a runtime really takes, learned from its 429s (AIMD, like TCP's window).

    Starts at ``ceiling`` (the runtime's ``max_concurrency``, never exceeded). A busy answer
    with ``in_flight`` calls already out halves the limit, and never leaves it above what was
    out (:meth:`refused`); ``probe_after`` x ``limit`` submits accepted while the limit was
    used up raise it by one (:meth:`accepted`), so a worker that gained capacity gets it back
    and one that did not costs one 429 per probe. The floor is 1: a worker busy with others'
    calls is still tried, one call at a time.
    """

    ceiling: int
    probe_after: int = 8
    limit: int = 0
    _accepted: int = 0

    def __post_init__(self) -> None:
        if not 1 <= self.limit <= self.ceiling:
            self.limit = self.ceiling

    def refused(self, in_flight: int) -> None:
        """The runtime answered busy with ``in_flight`` of our calls out: decrease."""
        self.limit = max(1, min(in_flight, self.limit // 2))
        self._accepted = 0

    def accepted(self, in_flight: int) -> None:
        """The runtime took a call with ``in_flight`` others out: increase, now and then."""
        if self.limit >= self.ceiling or in_flight + 1 < self.limit:
            return  # at the ceiling, or the limit was not used up: nothing learned
        self._accepted += 1
        if self._accepted >= self.probe_after * self.limit:
            self.limit += 1
            self._accepted = 0

    def rebase(self, ceiling: int) -> None:
        """The config's ``max_concurrency`` changed to ``ceiling``: the new ceiling at once.

        A limit that sat at the old ceiling (nothing learned) moves to the new one, up or down;
        a limit learned lower from 429s stays — it is what the worker took, and a config change
        says nothing about the worker — but never above the new ceiling, and it grows back by
        :meth:`accepted` as before (docs/runtimes.md).
        """
        learned = self.limit < self.ceiling
        self.ceiling = ceiling
        self.limit = min(max(self.limit, 1), ceiling) if learned else ceiling


def reaches(models: Iterable[str], live: Collection[str]) -> bool:
    """Whether an ``upstream`` runtime serving ``models`` is reachable: one of them has an
    endpoint in rotation (``live``, :meth:`gpugate.core.registry.Registry.models`). The
    operator's view (``GET /admin/runtimes/{id}``) and the walk both ask this."""
    return any(model in live for model in models)


def runtime_views(
    config: GatewayConfig,
    implemented: Collection[str],
    *,
    disabled: Collection[str] = (),
    unreachable: Collection[str] = (),
    over_budget: Collection[str] = (),
    live_models: Collection[str] | None = None,
) -> dict[str, RuntimeView]:
    """Every configured runtime as the walk sees it, from the config and the live facts given.

    ``implemented``: the runtime ids the gateway built an implementation for. A runtime of kind
    ``modal`` is external; one of kind ``upstream`` is, for the models that only external
    upstreams serve. ``live_models`` (the models with an endpoint in rotation now; None: not
    known) makes an ``upstream`` runtime unreachable when none of its models is live
    (:func:`reaches`), and unreachable for each model that is not; ``unreachable`` names other
    runtimes found unreachable. ``leased`` is left at 0: the dispatcher counts calls in flight.
    """
    external_only = frozenset(
        model
        for model in config.served_models()
        if all(u.external for u in config.upstreams_serving(model))
    )
    views: dict[str, RuntimeView] = {}
    for runtime in config.runtimes:
        is_upstream = runtime.kind == "upstream"
        models = frozenset(config.runtime_models(runtime.id))
        reachable = runtime.id not in unreachable
        down: frozenset[str] = frozenset()
        if is_upstream and live_models is not None:
            reachable = reachable and reaches(models, live_models)
            down = frozenset(model for model in models if model not in live_models)
        views[runtime.id] = RuntimeView(
            id=runtime.id,
            kind=runtime.kind,
            models=models,
            enabled=runtime.enabled and runtime.id not in disabled,
            implemented=runtime.id in implemented,
            reachable=reachable,
            over_budget=runtime.id in over_budget,
            external=runtime.kind == "modal",
            max_concurrency=runtime.max_concurrency,
            external_models=external_only if is_upstream else frozenset(),
            unreachable_models=down,
        )
    return views
