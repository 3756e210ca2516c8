"""Endpoint state and picking: which URL of which upstream gets the next request.

An :class:`EndpointState` is the live, in-memory view of one endpoint: requests in flight, a
latency EWMA, and its health as seen by two observers.

* **Passive health** (outlier ejection) watches real traffic. :func:`record_failure` ejects the
  endpoint when the failures in a rolling window reach ``failure_ratio`` (with at least
  ``min_samples`` outcomes; the window counts outcomes in :data:`WINDOW_SLICES` slices of time, so
  its memory is bounded whatever the request rate), or after ``consecutive_failures`` in a row —
  but never on a single failure. An ejected endpoint sits out ``cooldown_s``; then it is
  *half-open*: exactly one probe request may go through (:func:`try_acquire_probe`, or
  :func:`claim`). The probe's success closes the circuit and resets the cooldown; its failure
  ejects again for twice as long, up to ``max_cooldown_s``.
* **Active health** is an optional prober's verdict (:func:`mark_probe_result`): down after
  ``down_after_failed_probes`` failed probes in a row, up again after one success. It is
  independent of passive health: an endpoint is available only when both allow it.

:func:`pick` is the pure policy: among available endpoints, the less loaded of two random ones
(power of two choices), ties to the lower latency EWMA, then at random.

* **Load signals** (429, 503: "alive but too busy") are neither successes nor failures
  (:func:`record_load_signal`): the endpoint is *backed off* until its ``Retry-After`` (or a
  short doubling backoff) has passed, and :func:`pick` prefers every endpoint that is not backed
  off; a backed-off one is a last resort, never ejected for being busy.
* The latency EWMA is learned from answers only (the caller feeds :func:`record_latency` with
  non-error responses), and a figure nobody refreshed decays (half-life
  :data:`LATENCY_HALF_LIFE_S`), so a fast-failing endpoint never wins ties by failing fast and
  an idle peer is measured again.

The request path uses them in this order, with no ``await`` between ``pick`` and ``claim``::

    ep = pick(candidates, rng, now, exclude=tried)
    probe = claim(ep, now)
    try:
        ...                                   # record_success / record_failure / record_latency
    finally:
        release(ep, probe=probe)

Times are seconds on a monotonic clock (``Clock.monotonic()``).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING

from gpugate.errors import NoHealthyUpstream

if TYPE_CHECKING:
    import random
    from collections.abc import Collection, Sequence

DEFAULT_EWMA_ALPHA = 0.3
#: An idle endpoint's latency figure halves every this many seconds without a new sample.
LATENCY_HALF_LIFE_S = 10.0
#: Passive health's window is this many slices of ``window_s / WINDOW_SLICES`` seconds, each
#: holding a count of outcomes and of failures: a slice leaves the window once its start is
#: ``window_s`` old, so the window spans the last ``window_s`` less up to one slice. (One entry
#: per outcome held ~6 MB per endpoint at 7,000 req/s and a 10 s window, kept after the load.)
WINDOW_SLICES = 20


@dataclass(frozen=True, slots=True)
class EjectionPolicy:
    """When passive and active health take an endpoint out of rotation, and for how long."""

    min_samples: int = 5
    window_s: float = 10.0
    failure_ratio: float = 0.5
    consecutive_failures: int = 5
    cooldown_s: float = 5.0
    max_cooldown_s: float = 60.0
    down_after_failed_probes: int = 2

    def __post_init__(self) -> None:
        problems = [
            message
            for ok, message in (
                (self.min_samples >= 1, "min_samples must be at least 1"),
                (self.window_s > 0, "window_s must be positive"),
                (0 < self.failure_ratio <= 1, "failure_ratio must be in (0, 1]"),
                (self.consecutive_failures >= 2, "consecutive_failures must be at least 2"),
                (self.cooldown_s > 0, "cooldown_s must be positive"),
                (self.max_cooldown_s >= self.cooldown_s, "max_cooldown_s must be >= cooldown_s"),
                (self.down_after_failed_probes >= 1, "down_after_failed_probes must be >= 1"),
            )
            if not ok
        ]
        if problems:
            raise ValueError("; ".join(problems))


class Health(StrEnum):
    """An endpoint's health at one moment."""

    HEALTHY = "healthy"
    EJECTED = "ejected"  # passive health took it out; cooldown running
    HALF_OPEN = "half-open"  # cooldown over; one probe request may go through
    DOWN = "down"  # the active prober says so


@dataclass(slots=True, eq=False, repr=False)
class EndpointState:
    """One endpoint URL of an upstream: load, latency and health. Mutable; compared by identity."""

    upstream_id: str
    url: str
    policy: EjectionPolicy = field(default_factory=EjectionPolicy)
    outstanding: int = 0
    latency_ewma_s: float | None = None
    latency_at: float = math.inf  # when the EWMA last learned a timed sample (inf: never decays)
    # load signals (429/503): backed off until this time; consecutive signals double the wait
    backoff_until: float = 0.0
    load_streak: int = 0
    # until when the endpoint's own ``Retry-After`` asked for no traffic (0: it asked nothing);
    # a retry waits this, never the gateway's own load backoff above (that only steers picks)
    asked_until: float = 0.0
    # passive health: the window's slices, oldest first, and its totals
    outcomes: deque[_Slice] = field(default_factory=deque)
    window_samples: int = 0
    window_failures: int = 0
    failure_streak: int = 0
    ejected_until: float | None = None  # None: the circuit is closed
    cooldown_s: float = 0.0  # of the current ejection; 0 when closed
    ejections: int = 0  # ever, for operators
    probing: bool = False  # the half-open probe is in flight
    # active health
    down: bool = False
    failed_probes: int = 0
    last_probe_at: float | None = None

    def __repr__(self) -> str:
        if self.down:
            state = "down"
        elif self.probing:
            state = "probing"
        elif self.ejected_until is not None:
            state = f"ejected until={self.ejected_until:g} cooldown={self.cooldown_s:g}s"
        else:
            state = "healthy"
        return f"<Endpoint {self.upstream_id} {self.url} out={self.outstanding} {state}>"


def health(ep: EndpointState, now: float) -> Health:
    """``ep``'s health at ``now``."""
    if ep.down:
        return Health.DOWN
    if ep.ejected_until is None:
        return Health.HEALTHY
    return Health.HALF_OPEN if now >= ep.ejected_until else Health.EJECTED


def is_available(ep: EndpointState, now: float) -> bool:
    """Whether a request may go to ``ep`` now: healthy, or half-open with its probe slot free."""
    if ep.down:  # health(ep, now) inline: this is asked several times per request
        return False
    until = ep.ejected_until
    return until is None or (now >= until and not ep.probing)


def pick(
    candidates: Sequence[EndpointState],
    rng: random.Random,
    now: float,
    *,
    exclude: Collection[str] = frozenset(),
) -> EndpointState:
    """The endpoint for the next request: power of two choices by least outstanding requests.

    Only available endpoints whose url is not in ``exclude`` compete. Ties on outstanding go to
    the lower latency EWMA, then at random. Raises :class:`~gpugate.errors.NoHealthyUpstream`
    when none is available. Pure: changes nothing (see :func:`claim`).
    """
    available = [ep for ep in candidates if ep.url not in exclude and is_available(ep, now)]
    if not available:
        raise _nothing_available(candidates, now, exclude)
    n = len(available)
    if n == 1:
        return available[0]
    if any(ep.backoff_until > now for ep in available):  # busy ones only as a last resort
        available = [ep for ep in available if ep.backoff_until <= now] or available
        n = len(available)
        if n == 1:
            return available[0]
    i = rng.randrange(n)
    j = rng.randrange(n - 1)
    return _less_loaded(available[i], available[j + (j >= i)], rng, now)


def _less_loaded(
    a: EndpointState, b: EndpointState, rng: random.Random, now: float
) -> EndpointState:
    if a.outstanding != b.outstanding:
        return a if a.outstanding < b.outstanding else b
    la, lb = latency(a, now), latency(b, now)
    if la is not None and lb is not None and la != lb:
        return a if la < lb else b
    return a if rng.random() < 0.5 else b


def latency(ep: EndpointState, now: float) -> float | None:
    """``ep``'s latency figure at ``now``: the EWMA, halved per :data:`LATENCY_HALF_LIFE_S`
    since its last sample (an idle endpoint's old figure fades, so it is tried again)."""
    value = ep.latency_ewma_s
    if value is None:
        return None
    idle = now - ep.latency_at
    if idle <= LATENCY_HALF_LIFE_S:  # fresh enough: the figure as learned (the common case)
        return value
    return value * math.exp2(-idle / LATENCY_HALF_LIFE_S)


def is_backed_off(ep: EndpointState, now: float) -> bool:
    """Whether ``ep`` asked for less traffic (429/503) and its backoff is still running."""
    return ep.backoff_until > now


def _nothing_available(
    candidates: Sequence[EndpointState], now: float, exclude: Collection[str]
) -> NoHealthyUpstream:
    if not candidates:
        return NoHealthyUpstream("no endpoint serves this request")
    counts: dict[str, int] = {}
    for ep in candidates:
        reason = "already tried" if ep.url in exclude else str(health(ep, now))
        if reason == Health.HALF_OPEN:
            reason = "probing"
        counts[reason] = counts.get(reason, 0) + 1
    summary = ", ".join(f"{n} {reason}" for reason, n in sorted(counts.items()))
    waits = [ep.ejected_until - now for ep in candidates if ep.ejected_until is not None]
    retry_after = float(max(1, math.ceil(min(waits)))) if waits else None
    return NoHealthyUpstream(
        f"no healthy endpoint among {len(candidates)} ({summary})", retry_after_s=retry_after
    )


def try_acquire_probe(ep: EndpointState, now: float) -> bool:
    """Take ``ep``'s one probe slot if it is half-open and the slot is free; whether it did."""
    if health(ep, now) is not Health.HALF_OPEN or ep.probing:
        return False
    ep.probing = True
    return True


def claim(ep: EndpointState, now: float) -> bool:
    """Count a request going to ``ep``; returns whether it is ``ep``'s half-open probe.

    Call right after :func:`pick` (no ``await`` between). Raises
    :class:`~gpugate.errors.NoHealthyUpstream` if ``ep`` is not available any more.
    """
    if ep.ejected_until is None and not ep.down:  # healthy, the common case: never a probe
        ep.outstanding += 1
        return False
    if not is_available(ep, now):
        raise NoHealthyUpstream(f"endpoint {ep.url} of {ep.upstream_id} is {health(ep, now)}")
    probe = try_acquire_probe(ep, now)
    ep.outstanding += 1
    return probe


def release(ep: EndpointState, *, probe: bool) -> None:
    """The request :func:`claim` counted has ended.

    A probe that recorded no outcome (cancelled, or a client error that says nothing about
    the endpoint) gives its slot back, so the next request may probe.
    """
    ep.outstanding = max(0, ep.outstanding - 1)
    if probe:
        ep.probing = False


def record_success(ep: EndpointState, now: float) -> None:
    """A request to ``ep`` succeeded. The half-open probe's success closes the circuit."""
    _observe(ep, now, ok=True)
    ep.failure_streak = 0
    ep.load_streak = 0
    if ep.probing:
        _close(ep)


def record_failure(ep: EndpointState, now: float) -> None:
    """A request to ``ep`` failed (connect error or 5xx); may eject it."""
    _observe(ep, now, ok=False)
    ep.failure_streak += 1
    if ep.probing:
        _eject(ep, now, min(2 * ep.cooldown_s, ep.policy.max_cooldown_s))
    elif ep.ejected_until is None and _should_eject(ep):
        _eject(ep, now, ep.policy.cooldown_s)


def record_load_signal(
    ep: EndpointState,
    now: float,
    retry_after_s: float | None,
    *,
    base_s: float = 0.5,
    max_s: float = 4.0,
) -> float:
    """``ep`` answered 429/503: back it off for ``retry_after_s`` when given, else for a
    doubling ``base_s`` (capped at ``max_s``) per signal in a row; returns the backoff. Not a
    failure (a busy endpoint is never ejected for it) and not a success."""
    ep.load_streak += 1
    if retry_after_s is None:
        wait = min(max_s, base_s * math.ldexp(1.0, min(ep.load_streak - 1, 30)))
    else:
        wait = retry_after_s
    ep.backoff_until = max(ep.backoff_until, now + wait)
    if ep.probing:  # a busy answer says the endpoint is alive: close the circuit
        _close(ep)
    return wait


def record_latency(
    ep: EndpointState,
    seconds: float,
    *,
    alpha: float = DEFAULT_EWMA_ALPHA,
    now: float | None = None,
) -> None:
    """Fold one answer's latency into ``ep``'s EWMA (the first sample sets it). Feed it answers
    only, never error responses (a fast failure must not look like a fast endpoint)."""
    previous = ep.latency_ewma_s
    if previous is not None and now is not None:
        previous = latency(ep, now)
    ep.latency_ewma_s = seconds if previous is None else alpha * seconds + (1 - alpha) * previous
    if now is not None:
        ep.latency_at = now


def mark_probe_result(ep: EndpointState, ok: bool, now: float) -> None:
    """An active health probe of ``ep`` came back ``ok`` or not."""
    ep.last_probe_at = now
    if ok:
        ep.failed_probes = 0
        ep.down = False
        if ep.ejected_until is not None and ep.ejected_until > now and not ep.probing:
            ep.ejected_until = now  # half-open at once: the next request may confirm recovery
        return
    ep.failed_probes += 1
    if ep.failed_probes >= ep.policy.down_after_failed_probes:
        ep.down = True


class _Slice:
    """One slice of passive health's window: its index (start / width) and its counts."""

    __slots__ = ("failures", "index", "samples")

    def __init__(self, index: int) -> None:
        self.index, self.samples, self.failures = index, 0, 0


def _observe(ep: EndpointState, now: float, *, ok: bool) -> None:
    window = ep.policy.window_s
    width = window / WINDOW_SLICES
    index = int(now // width)
    outcomes = ep.outcomes
    if outcomes and outcomes[-1].index == index:
        current = outcomes[-1]
    else:
        current = _Slice(index)
        outcomes.append(current)
    current.samples += 1
    ep.window_samples += 1
    if not ok:
        current.failures += 1
        ep.window_failures += 1
    horizon = now - window
    while outcomes[0].index * width <= horizon:
        old = outcomes.popleft()
        ep.window_samples -= old.samples
        ep.window_failures -= old.failures


def _should_eject(ep: EndpointState) -> bool:
    policy = ep.policy
    if ep.failure_streak >= policy.consecutive_failures:  # at least 2, by EjectionPolicy
        return True
    if ep.window_failures < 2:  # never on a single failure
        return False
    samples = ep.window_samples
    return samples >= policy.min_samples and ep.window_failures / samples >= policy.failure_ratio


def _eject(ep: EndpointState, now: float, cooldown_s: float) -> None:
    ep.ejected_until = now + cooldown_s
    ep.cooldown_s = cooldown_s
    ep.probing = False
    ep.ejections += 1


def _close(ep: EndpointState) -> None:
    ep.ejected_until = None
    ep.cooldown_s = 0.0
    ep.probing = False
    ep.failure_streak = 0
    ep.outcomes.clear()
    ep.window_samples = 0
    ep.window_failures = 0
