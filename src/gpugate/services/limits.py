"""A client key's limits on the request path: reserve before admission, settle at the end.

Every reservation is one transaction on the shared store (:meth:`KeyStore.reserve_quota`), so
the limits hold for the sum of a key's traffic over every replica. A key without limits never
touches the store here. A refusal is a 429 with ``Retry-After`` (the next minute for the
per-minute limits, the next UTC day for the budgets, 1 s for concurrency) and one audit event
per key, limit and minute at most (sampled).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass

from gpugate.clock import Clock
from gpugate.config import GatewayConfig
from gpugate.core.keys import Principal
from gpugate.core.limits import (
    Estimate,
    Price,
    Windows,
    estimate,
    seconds_to_next_day,
    seconds_to_next_minute,
    windows,
)
from gpugate.errors import LIMIT_ERRORS
from gpugate.metrics import Metrics
from gpugate.store import AuditEvent, Store
from gpugate.store.keys import KEY_LIMITED

log = logging.getLogger("gpugate.keys")

_MAX_SAMPLED = 10000  # (key, code) pairs remembered for sampling within one minute


@dataclass(frozen=True, slots=True)
class Reservation:
    """What one request holds of its key's limits until it ends."""

    key_id: str
    windows: Windows
    estimate: Estimate
    price: Price | None


class Quota:
    """Reserve and settle client-key limits."""

    def __init__(
        self,
        store: Store,
        clock: Clock,
        metrics: Metrics,
        prices: Callable[[str], Price | None],
    ) -> None:
        self._store = store
        self._clock = clock
        self._metrics = metrics
        self._prices = prices
        self._sampled: set[tuple[str, str]] = set()
        self._sampled_minute = ""

    async def reserve(
        self, principal: Principal, model: str | None, doc: object, body_size: int
    ) -> Reservation | None:
        """Hold the request's estimate against its key's limits (None: the key has none), or
        raise the limit's error (429, Retry-After)."""
        key = principal.key
        if not key.limits.any:
            return None
        price = self._prices(model) if model is not None else None
        est = estimate(doc if isinstance(doc, dict) else None, body_size, price)
        now = self._clock.now()
        spans = windows(now)
        code = await self._store.reserve_quota(key.id, key.limits, est, spans)
        if code is None:
            return Reservation(key.id, spans, est, price)
        self._metrics.key_refusals.labels(code).inc()
        await self._audit_sampled(principal, code, spans)
        if code in ("RATE_LIMITED", "TOKEN_LIMITED"):
            wait = seconds_to_next_minute(now)
        elif code == "BUDGET_EXCEEDED":
            wait = seconds_to_next_day(now)
        else:
            wait = 1.0
        raise LIMIT_ERRORS[code](
            f"client key {key.prefix}… is over its limit ({code})", retry_after_s=math.ceil(wait)
        )

    async def settle(
        self,
        held: Reservation | None,
        prompt_tokens: int,
        completion_tokens: int,
        model: str | None,
    ) -> float:
        """The request ended with this usage: replace the estimate; the cost in cents."""
        price = held.price if held is not None else (self._prices(model) if model else None)
        cents = 0.0 if price is None else price.cents(prompt_tokens, completion_tokens)
        if held is not None:
            await self._store.settle_quota(
                held.key_id,
                held.windows,
                held.estimate,
                tokens=prompt_tokens + completion_tokens,
                cents=cents,
                requests=1,
            )
        return cents

    async def release(self, held: Reservation | None) -> None:
        """The request failed before the upstream answered: give everything back."""
        if held is not None:
            await self._store.settle_quota(
                held.key_id, held.windows, held.estimate, tokens=0, cents=0.0, requests=0
            )

    async def _audit_sampled(self, principal: Principal, code: str, spans: Windows) -> None:
        if spans.minute != self._sampled_minute:
            self._sampled, self._sampled_minute = set(), spans.minute
        mark = (principal.key.id, code)
        if mark in self._sampled or len(self._sampled) >= _MAX_SAMPLED:
            return
        self._sampled.add(mark)
        key = principal.key
        detail = {"code": code, "prefix": key.prefix, "tenant": key.tenant, "sampled": "minute"}
        await self._store.append_audit(AuditEvent("gateway", KEY_LIMITED, f"key:{key.id}", detail))

    def __repr__(self) -> str:
        return f"<Quota sampled={len(self._sampled)}>"


def prices_of(config: Callable[[], GatewayConfig]) -> Callable[[str], Price | None]:
    """A model's price from the config's ``models:`` entries (``price``), or None."""

    def price(model: str) -> Price | None:
        entries = getattr(config(), "models", None)  # the models: policy list, once it exists
        for entry in entries if isinstance(entries, list) else ():
            if getattr(entry, "name", None) == model and getattr(entry, "price", None):
                p = entry.price
                return Price(p.prompt_per_1k_cents, p.completion_per_1k_cents)
        return None

    return price
