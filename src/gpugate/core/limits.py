"""A key's limits as arithmetic: what a request is estimated to cost, and which window it counts in.

Before admission the gateway reserves a request's *estimate* against the key's windows (the
current UTC minute for ``requests_per_min``/``tokens_per_min``, the UTC day for
``daily_tokens``/``daily_cents``) and one concurrency slot, from what its replica leased of
them (:func:`grant`); when the response ends the estimate is replaced by the real usage
(reconciled), and on a failure before the upstream answered the whole reservation is given
back. The estimate is the prompt's size in tokens (about four bytes a
token) plus the completion's ceiling (``max_completion_tokens`` / ``max_tokens``, else
:data:`DEFAULT_COMPLETION_TOKENS`). Windows are fixed (not sliding): a key may send its minute's
limit at the end of one minute and again at the start of the next.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from gpugate.core.keys import Limits

BYTES_PER_TOKEN = 4
DEFAULT_COMPLETION_TOKENS = 256


@dataclass(frozen=True, slots=True)
class Price:
    """A model's price: cents per 1000 prompt tokens and per 1000 completion tokens."""

    prompt_per_1k_cents: float = 0.0
    completion_per_1k_cents: float = 0.0

    def cents(self, prompt_tokens: int, completion_tokens: int) -> float:
        return (
            prompt_tokens * self.prompt_per_1k_cents
            + completion_tokens * self.completion_per_1k_cents
        ) / 1000


@dataclass(slots=True, init=False)  # not frozen: one per limited request (a setattr per field)
class Estimate:
    """What a request is expected to use, before it is sent (``tokens``: both, read a few times
    per request, added once)."""

    prompt_tokens: int
    completion_tokens: int
    cents: float
    tokens: int

    def __init__(self, prompt_tokens: int, completion_tokens: int, cents: float) -> None:
        # by hand: a dataclass's __init__ and then its __post_init__ are two calls per request
        self.prompt_tokens = prompt_tokens
        self.completion_tokens = completion_tokens
        self.cents = cents
        self.tokens = prompt_tokens + completion_tokens


def estimated_tokens(doc: dict[str, Any] | None, body_size: int) -> tuple[int, int]:
    """The prompt and completion tokens a request is estimated at, from its parsed body (or
    only its size): the rule :func:`estimate` prices (the hot path takes the two numbers
    alone, into the reservation they make, so that a request builds one object, not two)."""
    prompt = body_size // BYTES_PER_TOKEN or 1
    if doc is None:
        return prompt, DEFAULT_COMPLETION_TOKENS
    ceiling = doc.get("max_completion_tokens")
    if ceiling is None:
        ceiling = doc.get("max_tokens")
    if type(ceiling) is int and ceiling >= 0:  # not a bool (an int's subclass), not a float
        return prompt, ceiling
    return prompt, DEFAULT_COMPLETION_TOKENS


def estimate(doc: dict[str, Any] | None, body_size: int, price: Price | None) -> Estimate:
    """The estimate of a request from its parsed body (or only its size)."""
    prompt, completion = estimated_tokens(doc, body_size)
    if price is None:
        return Estimate(prompt, completion, 0.0)
    return Estimate(prompt, completion, price.cents(prompt, completion))


@dataclass(frozen=True, slots=True)
class Windows:
    """The windows a request counts in: its UTC minute and its UTC day."""

    minute: str  # "2026-12-01T13:20"
    day: str  # "2026-12-01"


def windows(now: datetime) -> Windows:
    return Windows(minute=now.strftime("%Y-%m-%dT%H:%M"), day=now.strftime("%Y-%m-%d"))


def minute_of(now: datetime) -> tuple[object, ...]:
    """What :func:`windows` depends on: equal for every instant of one minute."""
    return (now.minute, now.hour, now.day, now.month, now.year, now.tzinfo)


def seconds_to_next_minute(now: datetime) -> float:
    return 60.0 - now.second - now.microsecond / 1e6


def seconds_to_next_day(now: datetime) -> float:
    return 86400.0 - (now.hour * 3600 + now.minute * 60 + now.second)


@dataclass(frozen=True, slots=True)
class Counts:
    """A key's counters as the store holds them when a lease is tried (``inflight``: the
    concurrency slots every live replica holds)."""

    minute_requests: int = 0
    minute_tokens: int = 0
    day_tokens: int = 0
    day_cents: float = 0.0
    inflight: int = 0


@dataclass(frozen=True, slots=True)
class Slice:
    """Quota a replica takes from the store at once, or was granted: minute requests and
    tokens, day tokens and cents, concurrency slots (``None``: the key has no such limit,
    nothing to take). Slots are held until the replica gives them back, not for a window."""

    requests: int | None = None
    tokens: int | None = None
    day_tokens: int | None = None
    day_cents: float | None = None
    slots: int | None = None


def never_fits(limits: Limits, est: Estimate, code: str) -> str | None:
    """Why a request refused with ``code`` would be refused in every window (its estimate is
    more than the limit itself, not only than what is left of it), or None."""
    over: list[tuple[str, float, float | None]]
    if code == "TOKEN_LIMITED" and limits.tokens_per_min is not None:
        over = [("tokens_per_min", est.tokens, limits.tokens_per_min)]
    elif code == "BUDGET_EXCEEDED":
        over = [("daily_tokens", est.tokens, limits.daily_tokens)]
        over.append(("daily_cents", est.cents, limits.daily_cents))
    else:
        return None
    for name, wanted, limit in over:
        if limit is not None and wanted > limit:
            return f"its estimate ({wanted:g}) is more than the key's whole {name} ({limit:g})"
    return None


def grant(limits: Limits, counts: Counts, want: Slice) -> Slice:
    """What the store can give of ``want`` now: each part capped at what is left of its limit
    (never below 0), so the sum of every replica's slices never passes a limit."""

    def left(limit: float | None, used: float, asked: float | None) -> float | None:
        if limit is None or asked is None:
            return None
        return max(0.0, min(asked, limit - used))

    requests = left(limits.requests_per_min, counts.minute_requests, want.requests)
    tokens = left(limits.tokens_per_min, counts.minute_tokens, want.tokens)
    day_tokens = left(limits.daily_tokens, counts.day_tokens, want.day_tokens)
    day_cents = left(limits.daily_cents, counts.day_cents, want.day_cents)
    slots = left(limits.concurrency, counts.inflight, want.slots)  # held by live replicas
    return Slice(
        None if requests is None else int(requests),
        None if tokens is None else int(tokens),
        None if day_tokens is None else int(day_tokens),
        day_cents,
        None if slots is None else int(slots),
    )
