"""Failed credential checks, throttled per client (the console login and the admin API).

A token bucket per key (a client address; an IPv6 address by its /64, which one host owns): a
client may fail ``burst`` times at once, then once every ``refill_s``; a success forgets it.
The defaults (30, then one per 4 s) stop online guessing at 15 tries a minute per address while
an operator's script, or a check of every admin route with a wrong token, still sees its 401s.
Memory is bounded: at most ``max_keys`` clients are remembered, the one that failed longest ago
forgotten first. Pure: the caller passes the time (a monotonic clock's seconds).
"""

from __future__ import annotations

import ipaddress
from collections import OrderedDict


def client_key(address: str | None) -> str:
    """The key a client is throttled under: its IPv4 address, its IPv6 /64, or ``unknown``."""
    if not address:
        return "unknown"
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address[:64]
    if ip.version == 6:
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip)


class FailureThrottle:
    """See the module docstring."""

    def __init__(self, *, burst: int = 30, refill_s: float = 4.0, max_keys: int = 10_000) -> None:
        self.burst = burst
        self.refill_s = refill_s
        self.max_keys = max_keys
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # tokens, at
        self.refused = 0

    def retry_after(self, key: str, now: float) -> float | None:
        """None when ``key`` may try now; else the seconds until it may."""
        tokens = self._tokens(key, now)
        if tokens >= 1:
            return None
        self.refused += 1
        return (1 - tokens) * self.refill_s

    def failed(self, key: str, now: float) -> None:
        """``key`` offered a wrong credential."""
        self._buckets[key] = (max(self._tokens(key, now) - 1, 0.0), now)
        self._buckets.move_to_end(key)
        while len(self._buckets) > self.max_keys:
            self._buckets.popitem(last=False)

    def succeeded(self, key: str) -> None:
        """``key`` offered the right credential: its failures are forgotten."""
        self._buckets.pop(key, None)

    def _tokens(self, key: str, now: float) -> float:
        bucket = self._buckets.get(key)
        if bucket is None:
            return float(self.burst)
        tokens, at = bucket
        return min(float(self.burst), tokens + max(now - at, 0.0) / self.refill_s)

    def __len__(self) -> int:
        return len(self._buckets)

    def __repr__(self) -> str:
        return (
            f"<FailureThrottle clients={len(self._buckets)} burst={self.burst} "
            f"refill_s={self.refill_s} refused={self.refused}>"
        )
