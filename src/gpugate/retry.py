"""When to try a call again and how long to wait first: shared by every sender of gpugate.

Foundation layer (the standard library only), so the push worker — a separate program that may
import only the foundation — uses the same rules as the gateway's sync path and dispatcher.

* :func:`retryable` — the HTTP statuses that say "try again later": 408 and 425 (the server did
  not act on the request and says so), 429 and the transient 5xx (500, 502, 503, 504). Every
  other status is an answer (a 4xx is the request's fault; 501 and 505 will not change). It is
  the one answer to "is this status retryable" in gpugate: the proxy, the ``upstream`` and push
  runtimes, the batch runner and the push worker (its reports and its model server's answers)
  all ask it.
* :class:`Backoff` — exponential backoff with *full jitter* (AWS architecture blog, "Exponential
  Backoff And Jitter"): the n-th wait is uniform in ``[0, min(max_s, base_s * 2**(n-1))]``, which
  spreads retries of many clients best for the least total wait.
* :func:`parse_retry_after` — RFC 9110 §10.2.3 ``Retry-After``: delay-seconds or an HTTP-date.
* :class:`RetryBudget` — retries of one destination stay a fraction of its requests over a
  rolling window (Finagle's and gRPC's retry budgets), so a dying upstream is not hammered.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

#: 408 Request Timeout and 425 Too Early (not acted on: RFC 9110 §15.5.9, RFC 8470 §5.2),
#: 429 Too Many Requests and the transient server errors.
RETRYABLE_STATUSES = frozenset({408, 425, 429, 500, 502, 503, 504})
#: Load signals: the server is alive but asks for less traffic (honour its Retry-After).
LOAD_STATUSES = frozenset({429, 503})


def retryable(status: int) -> bool:
    """Whether an HTTP response with ``status`` may succeed if the request is sent again."""
    return status in RETRYABLE_STATUSES


def is_load_signal(status: int) -> bool:
    """Whether ``status`` says "too busy" (429, 503) rather than "broken"."""
    return status in LOAD_STATUSES


@dataclass(frozen=True, slots=True)
class Backoff:
    """Exponential backoff with full jitter, capped.

    ``delay(1)`` is the wait before the second try (after the first failed), ``delay(2)``
    before the third, and so on; each is drawn from ``[0, ceiling(n)]``.
    """

    base_s: float
    max_s: float
    rng: random.Random = field(default_factory=random.Random, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.base_s < 0 or self.max_s < 0:
            raise ValueError("backoff times must not be negative")

    def ceiling(self, attempt: int) -> float:
        """The longest wait after ``attempt`` failed tries (``attempt`` >= 1)."""
        if attempt < 1:
            return 0.0
        exponent = min(attempt - 1, 62)  # 2**62 * base is past any cap; no float overflow
        return min(self.max_s, self.base_s * math.ldexp(1.0, exponent))

    def delay(self, attempt: int) -> float:
        """A random wait in ``[0, ceiling(attempt)]`` (full jitter)."""
        return self.rng.uniform(0.0, self.ceiling(attempt))


def parse_retry_after(value: str | bytes | None, now: datetime) -> float | None:
    """Seconds to wait from ``now`` as a ``Retry-After`` value says, or ``None`` when absent or
    unreadable.

    Delay-seconds (``"2"``; a decimal such as ``"1.5"`` is accepted too, as some servers send
    it) or an HTTP-date (``"Wed, 21 Oct 2015 07:28:00 GMT"``). A date in the past is 0; a
    negative, non-finite or garbled value is ``None``: the caller then falls back to its own
    backoff.
    """
    if value is None:
        return None
    text = value.decode("latin-1") if isinstance(value, bytes) else value
    text = text.strip()
    if not text:
        return None
    try:
        seconds = float(text)
    except ValueError:
        return _seconds_until(text, now)
    if not math.isfinite(seconds) or seconds < 0:
        return None
    return seconds


def _seconds_until(http_date: str, now: datetime) -> float | None:
    try:
        when = parsedate_to_datetime(http_date)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # RFC 9110 dates are GMT; a naive parse means "-0000"
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - now).total_seconds())


class RetryBudget:
    """Retries ≤ ``ratio`` x requests over the last ``window_s`` seconds, with ``floor`` retries
    always allowed (so a quiet upstream still gets its few retries).

    Counted in one-second buckets: :meth:`note_request` and :meth:`try_spend` are O(1) and
    allocate nothing. ``now`` is any monotonic clock in seconds.
    """

    __slots__ = ("_requests", "_retries", "_stamp", "floor", "ratio", "window_s")

    def __init__(self, *, ratio: float = 0.2, floor: int = 10, window_s: int = 10) -> None:
        if not (0 <= ratio <= 1 and floor >= 0 and window_s >= 1):
            raise ValueError("a retry budget needs 0 <= ratio <= 1, floor >= 0, window_s >= 1")
        self.ratio = ratio
        self.floor = floor
        self.window_s = window_s
        self._requests = [0] * window_s
        self._retries = [0] * window_s
        self._stamp = [-1] * window_s  # the second each bucket holds

    def _bucket(self, now: float) -> int:
        second = int(now)
        i = second % self.window_s
        if self._stamp[i] != second:
            self._stamp[i] = second
            self._requests[i] = 0
            self._retries[i] = 0
        return i

    def note_request(self, now: float) -> None:
        """A first try went out."""
        self._requests[self._bucket(now)] += 1

    def _sums(self, now: float) -> tuple[int, int]:
        oldest = int(now) - self.window_s
        requests = retries = 0
        for i in range(self.window_s):
            if self._stamp[i] > oldest:
                requests += self._requests[i]
                retries += self._retries[i]
        return requests, retries

    def try_spend(self, now: float) -> bool:
        """Take one retry from the budget if it has one; whether it did."""
        i = self._bucket(now)
        requests, retries = self._sums(now)
        if retries >= max(self.floor, self.ratio * requests):
            return False
        self._retries[i] += 1
        return True

    def __repr__(self) -> str:
        return f"<RetryBudget {self.ratio:.0%} over {self.window_s}s, floor {self.floor}>"
