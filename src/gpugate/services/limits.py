"""A client key's limits on the request path: reserve before admission, settle at the end.

The limits hold for the sum of a key's traffic over every replica, and the hot path mostly does
not wait on the store:

* **Leases** (rpm, tpm, daily tokens and cents). Each replica takes a *slice* of a key's minute
  and day quota from the store in one locked step (:meth:`KeyStore.lease_quota`: 1/20 of each
  minute limit, 1/100 of each daily one, at least the request's estimate) and admits requests
  against it locally; a request's unused estimate goes back to the local slice when it ends, a
  failed one gives all of it back. The store only ever hands out what is left of a limit, so
  the sum of every replica's slices — and so what is served — never passes it; what a replica
  leased and did not use in a minute is lost to that minute (the undershoot: at most one
  slice per replica and window).
* **Concurrency slots** are leased too, but held until given back, not for a window: a replica
  takes up to 1/20 of a key's ``concurrency`` at a time (at least one; the slots every live
  replica holds count against the limit, so their sum never passes it), admits a request per
  free slot. Nothing goes back on the request path (an event loop ends requests in bursts:
  a key under load has none in flight here many times a second); every :data:`IDLE_SLOTS_S`
  (:meth:`Quota.sweep`) the free slots beyond 1/20 of a busy key go back, and all of an idle
  one. A small limit (under 20) keeps nothing: its slot goes back at every
  request's end, so it stays exact, as before. A key busy on one replica is served with a few
  transactions a second, not two per request; the undershoot is what a replica holds free: up
  to what it leased and has not used for at most a second, then 1/20 of the limit while busy.
  A replica that dies holding slots loses them when it has been silent for 30 s.

A key without limits never touches the store here. A refusal is a 429 with ``Retry-After``
(the next minute for the per-minute limits, the next UTC day for the budgets, 1 s for
concurrency) and one audit event per key, limit and minute at most (sampled).
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from gpugate.clock import Clock
from gpugate.config import GatewayConfig
from gpugate.core.keys import ClientKey, Limits, Principal
from gpugate.core.limits import (
    Estimate,
    Price,
    Slice,
    Windows,
    estimate,
    estimated_tokens,
    minute_of,
    never_fits,
    seconds_to_next_day,
    seconds_to_next_minute,
    windows,
)
from gpugate.errors import LIMIT_ERRORS, StoreError
from gpugate.metrics import Metrics
from gpugate.store import AuditEvent, Store
from gpugate.store.keys import KEY_LIMITED

log = logging.getLogger("gpugate.keys")

_MAX_SAMPLED = 10000  # (key, code) pairs remembered for sampling within one minute


class Reservation(Estimate):
    """What one request holds of its key's limits until it ends: its estimate (priced at
    ``price``, its model's when it was reserved), taken from this replica's lease of key
    ``key_id`` in ``windows``. One object per limited request, its estimate's fields its own."""

    __slots__ = ("key_id", "price", "windows")

    def __init__(  # positional only where it is made: keywords cost a dict per call
        self,
        key_id: str,
        windows: Windows,
        price: Price | None,
        prompt_tokens: int,
        completion_tokens: int,
    ) -> None:
        self.key_id = key_id
        self.windows = windows
        self.price = price
        self.prompt_tokens = prompt_tokens
        self.completion_tokens = completion_tokens
        self.tokens = prompt_tokens + completion_tokens
        self.cents = 0.0 if price is None else price.cents(prompt_tokens, completion_tokens)

    def __repr__(self) -> str:
        return (
            f"<Reservation key={self.key_id} {self.windows.minute} tokens={self.tokens}"
            f" cents={self.cents}>"
        )


MINUTE_SLICE = 20  # a replica leases 1/20 of a per-minute limit at a time
DAY_SLICE = 100  # and 1/100 of a daily one
IDLE_SLOTS_S = 1.0  # how long a key idle here keeps its last free slots (1/20 of its limit)

#: What a lease holds of a count the key has no limit on: a small int, so that every part is
#: counted and compared alike with no branch, in CPython's fast small-int arithmetic (``inf``
#: made each comparison a float conversion). A new minute's lease starts its minute parts at it;
#: a part run down (a day's, carried over) fails :meth:`_Lease.took`, and the slow path tops it
#: up (:meth:`_Lease.unlimited`) before it judges: no limit the key does not have ever refuses.
UNLIMITED = 2**30 - 1


@dataclass(slots=True)
class _Lease:
    """What this replica holds of one key's quota in the current windows (:data:`UNLIMITED`
    for a count the key has no limit on, ``inf`` for its cents), and of its concurrency slots
    (``slots`` free, ``inflight`` taken; carried from one window's lease to the next)."""

    windows: Windows
    requests: int
    tokens: int
    day_tokens: int
    day_cents: float
    priced: bool  # whether the key has a daily cents budget: only then do prices count here
    slots: int = UNLIMITED
    inflight: int = 0  # this key's requests in flight here
    concurrent: bool = False  # whether the key has a concurrency limit (slots held for it)
    #: free slots kept once its last request here ended (until the next sweep) and, while it
    #: is busy, at each sweep; 0 below a limit of 20: every free slot back at a request's end
    keep: int = 0
    #: the limits it was leased under (:meth:`Quota.limits_seen`: other limits, a new lease)
    limits: Limits | None = None
    refill: asyncio.Lock = field(default_factory=asyncio.Lock)

    def short(self, limits: Limits, est: Estimate) -> str | None:
        """The code of the first limit this request does not fit in (why :meth:`took` said
        no), or None: then it is taken (a part without a limit never refuses, even an estimate
        above :data:`UNLIMITED`)."""
        if limits.concurrency is not None and self.slots < 1:
            return "CONCURRENCY_LIMITED"
        if limits.requests_per_min is not None and self.requests < 1:
            return "RATE_LIMITED"
        if limits.tokens_per_min is not None and self.tokens < est.tokens:
            return "TOKEN_LIMITED"
        if limits.daily_tokens is not None and self.day_tokens < est.tokens:
            return "BUDGET_EXCEEDED"
        if self.day_cents < est.cents:  # inf without a limit
            return "BUDGET_EXCEEDED"
        self.take(1, est.tokens, est.cents)
        self.slots -= 1
        self.inflight += 1
        return None

    def took(self, est: Estimate) -> bool:
        """Whether one request fits every part as the lease holds them, and then it is taken:
        the hot path's check and :meth:`take` in one call, with no look at the limits (a part
        without one holds :data:`UNLIMITED`); :meth:`short` is the slow path's judgement."""
        tokens, cents = est.tokens, est.cents
        if self.requests < 1 or self.tokens < tokens or self.day_tokens < tokens:
            return False
        if self.day_cents < cents or self.slots < 1:
            return False
        self.requests -= 1
        self.tokens -= tokens
        self.day_tokens -= tokens
        self.day_cents -= cents
        self.slots -= 1
        self.inflight += 1
        return True

    def take(self, requests: int, tokens: int, cents: float) -> None:
        """Count against the slice (negative amounts give back)."""
        self.requests -= requests
        self.tokens -= tokens
        self.day_tokens -= tokens
        self.day_cents -= cents

    def ended(self) -> int:
        """One of the key's requests ended, its slot free again: how many free slots go back
        to the store now. A small limit's (``keep`` 0: under 20) at once, so that it stays
        exact; a larger one's none: :meth:`Quota.sweep` gives back all but ``keep`` of a busy
        key's and all of an idle one's. (An event loop ends and starts requests in bursts, so
        a key under load has no request in flight here many times a second: giving back at
        that moment, and leasing again at the next burst, measured ~200 transactions a second
        under 64 connections.)"""
        self.inflight -= 1
        if not self.concurrent:  # no slots held: a window's UNLIMITED, never given back
            return 0
        self.slots += 1
        if self.keep:
            return 0
        spare, self.slots = self.slots, 0
        return spare

    def unlimited(self, limits: Limits) -> None:
        """The parts of counts the key has no limit on full again."""
        if limits.concurrency is None:
            self.slots = UNLIMITED
        if limits.requests_per_min is None:
            self.requests = UNLIMITED
        if limits.tokens_per_min is None:
            self.tokens = UNLIMITED
        if limits.daily_tokens is None:
            self.day_tokens = UNLIMITED

    def add(self, got: Slice) -> None:
        if got.requests is not None:
            self.requests += got.requests
        if got.tokens is not None:
            self.tokens += got.tokens
        if got.day_tokens is not None:
            self.day_tokens += got.day_tokens
        if got.day_cents is not None:
            self.day_cents += got.day_cents
        if got.slots is not None:
            self.slots += got.slots


def _empty_lease(limits: Limits, spans: Windows, old: _Lease | None) -> _Lease:
    """A lease for new windows: a new minute empties the minute parts, a new day the day's."""

    def zero(limit: float | None) -> int:
        return UNLIMITED if limit is None else 0

    same_day = old is not None and old.windows.day == spans.day
    concurrency = limits.concurrency
    concurrent = concurrency is not None
    # slots are held across windows: what the old lease holds stays held (a key given a limit
    # since starts with none)
    carried = old is not None and old.concurrent and concurrent
    return _Lease(
        windows=spans,
        requests=zero(limits.requests_per_min),
        tokens=zero(limits.tokens_per_min),
        day_tokens=old.day_tokens if same_day and old else zero(limits.daily_tokens),
        day_cents=(
            math.inf if limits.daily_cents is None else old.day_cents if same_day and old else 0.0
        ),
        priced=limits.daily_cents is not None,
        slots=old.slots if carried and old else zero(concurrency),
        inflight=old.inflight if old else 0,
        concurrent=concurrent,
        keep=0 if concurrency is None else concurrency // MINUTE_SLICE,
        limits=limits,
    )


def _want(limits: Limits, est: Estimate) -> Slice:
    def part(limit: float | None, divisor: int, floor: float) -> float | None:
        return None if limit is None else max(floor, limit / divisor)

    requests = part(limits.requests_per_min, MINUTE_SLICE, 1)
    tokens = part(limits.tokens_per_min, MINUTE_SLICE, est.tokens)
    day_tokens = part(limits.daily_tokens, DAY_SLICE, est.tokens)
    slots = part(limits.concurrency, MINUTE_SLICE, 1)
    return Slice(
        None if requests is None else math.ceil(requests),
        None if tokens is None else math.ceil(tokens),
        None if day_tokens is None else math.ceil(day_tokens),
        part(limits.daily_cents, DAY_SLICE, est.cents),
        None if slots is None else int(slots),
    )


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
        self._leases: dict[str, _Lease] = {}  # bounded by the keys that sent this minute
        self._minute: tuple[tuple[object, ...], Windows | None] = ((), None)
        self._minute_ends = -math.inf  # when _minute's windows stop being now (monotonic)

    def limits_seen(self, key: ClientKey) -> None:
        """A lookup of ``key`` found it (every ``auth.key_cache_s`` per replica, at once on the
        replica that changed it): if its limits are not those its lease here was made under,
        the lease starts again from the store under the new ones, so a lowered limit is not
        passed by what was leased under the old one (what that lease held unused is lost to
        its window, as at a window's end). Its concurrency slots stay held."""
        lease = self._leases.get(key.id)
        limits = key.limits
        if lease is None or lease.limits == limits:
            return
        fresh = _empty_lease(limits, lease.windows, lease)
        fresh.day_tokens = UNLIMITED if limits.daily_tokens is None else 0
        fresh.day_cents = math.inf if limits.daily_cents is None else 0.0
        self._leases[key.id] = fresh

    def reserve_now(
        self, principal: Principal, model: str | None, doc: dict[str, Any] | None, body_size: int
    ) -> Reservation | None:
        """:meth:`reserve` of a request this replica's lease holds already: no await, no
        store; None when it does not (a key without a lease yet, or a short one: then
        :meth:`reserve` refills or refuses)."""
        key_id = principal.key.id
        lease = self._leases.get(key_id)
        if (  # a lease of the current windows (made this minute, and the minute not over yet)
            lease is None
            or lease.windows is not self._minute[1]
            or self._clock.monotonic() >= self._minute_ends
        ):
            return None
        # a price only counts against a lease's daily cents (usage is priced when written)
        price = self._prices(model) if lease.priced and model is not None else None
        prompt, completion = estimated_tokens(doc, body_size)
        held = Reservation(key_id, lease.windows, price, prompt, completion)
        return held if lease.took(held) else None

    async def reserve(
        self, principal: Principal, model: str | None, doc: object, body_size: int
    ) -> Reservation | None:
        """Hold the request's estimate against its key's limits (None: the key has none), or
        raise the limit's error (429, Retry-After)."""
        key = principal.key
        if not principal.limited:
            return None
        body = doc if isinstance(doc, dict) else None  # a job's input may be any JSON
        held = self.reserve_now(principal, model, body, body_size)
        if held is not None:
            return held
        priced = key.limits.daily_cents is not None  # prices only count against cents
        price = self._prices(model) if model is not None and priced else None
        est = estimate(body, body_size, price)
        spans = self._current_windows()
        code = await self._lease(key.id, key.limits, est, spans)
        if code is None:
            return Reservation(key.id, spans, price, est.prompt_tokens, est.completion_tokens)
        self._metrics.key_refusals.labels(code).inc()
        await self._audit_sampled(principal, code, spans)
        now = self._clock.now()
        if code in ("RATE_LIMITED", "TOKEN_LIMITED"):
            wait = seconds_to_next_minute(now)
        elif code == "BUDGET_EXCEEDED":
            wait = seconds_to_next_day(now)
        else:
            wait = 1.0
        message = f"client key {key.prefix}… is over its limit ({code})"
        never = never_fits(key.limits, est, code)
        if never is not None:  # no retry can succeed: say so, and what to change
            message = (
                f"client key {key.prefix}… cannot take this request ({code}): {never}, so no "
                "window can hold it; send a lower max_tokens (the estimate is prompt bytes / 4 "
                "plus max_tokens, 256 without one)"
            )
        raise LIMIT_ERRORS[code](message, retry_after_s=math.ceil(wait))

    async def _lease(
        self, key_id: str, limits: Limits, est: Estimate, spans: Windows
    ) -> str | None:
        """Take the estimate from this replica's slice, refilling it from the store when short;
        the code of the limit it does not fit, or None."""
        lease = self._leases.get(key_id)
        if lease is None or (lease.windows is not spans and lease.windows != spans):
            if len(self._leases) > _MAX_SAMPLED:  # keep the current ones and those holding slots
                self._leases = {
                    k: v for k, v in self._leases.items() if v.windows == spans or v.inflight
                }
            lease = self._leases[key_id] = _empty_lease(limits, spans, lease)
        if lease.took(est):
            return None
        async with lease.refill:  # one refill at a time; the others then look again
            lease.unlimited(limits)
            if lease.took(est):
                return None
            lease.add(await self._store.lease_quota(key_id, limits, _want(limits, est), spans))
        return None if lease.took(est) else lease.short(limits, est)

    def _give_back(self, held: Reservation, requests: int, tokens: int, cents: float) -> int:
        """Counts back to the lease ``held`` came from, as far as its windows are still the
        lease's; its slot in any case. The slots to give back to the store (:meth:`ended`)."""
        lease = self._leases.get(held.key_id)
        if lease is None:
            return 0
        if lease.windows is held.windows or lease.windows == held.windows:
            lease.take(-requests, -tokens, -cents)
        elif lease.windows.day == held.windows.day:  # a new minute: only the day's parts
            lease.day_tokens += tokens
            lease.day_cents += cents
        # (a new day: what the old one held is gone with it)
        return lease.ended()

    def settle_local(
        self, held: Reservation | None, prompt_tokens: int, completion_tokens: int
    ) -> int:
        """The request ended with this usage: the estimate's unused part back to this
        replica's lease (priced at its model's price when it was reserved); no await. The
        concurrency slots to give back to the store now (0 but when a key with a concurrency
        limit under 20, whose slot goes back at once: :meth:`settle` and the data plane's end)."""
        if held is None:
            return 0
        price = held.price
        unused = held.tokens - prompt_tokens - completion_tokens
        unused_cents = (
            0.0 if price is None else held.cents - price.cents(prompt_tokens, completion_tokens)
        )
        lease = self._leases.get(held.key_id)
        if lease is not None and lease.windows is held.windows:  # most: the same minute
            lease.tokens += unused
            lease.day_tokens += unused
            if unused_cents:
                lease.day_cents += unused_cents
            if lease.concurrent:
                return lease.ended()
            lease.inflight -= 1  # ended(), without the call, for a key without slots
            return 0
        return self._give_back(held, 0, unused, unused_cents)

    async def settle(
        self, held: Reservation | None, prompt_tokens: int, completion_tokens: int
    ) -> None:
        """:meth:`settle_local`, and the spare slots given back."""
        spare = self.settle_local(held, prompt_tokens, completion_tokens)
        if spare and held is not None:
            await self.return_slots(held.key_id, spare)

    def release_local(self, held: Reservation | None) -> int:
        """The request failed before the upstream answered: everything back to the lease;
        no await. The slots to give back to the store, as :meth:`settle_local`."""
        if held is None:
            return 0
        return self._give_back(held, 1, held.tokens, held.cents)

    async def release(self, held: Reservation | None) -> None:
        """:meth:`release_local`, and the spare slots given back."""
        spare = self.release_local(held)
        if spare and held is not None:
            await self.return_slots(held.key_id, spare)

    async def sweep(self) -> None:
        """Give back the free slots this replica holds beyond what each key keeps: all of a
        key with nothing in flight here, all but ``keep`` of a busy one (so that a replica
        holds no more than it uses for longer than :data:`IDLE_SLOTS_S`)."""
        for key_id, lease in list(self._leases.items()):
            if not lease.concurrent:
                continue
            keep = lease.keep if lease.inflight > 0 else 0
            if lease.slots > keep:
                spare, lease.slots = lease.slots - keep, keep
                await self.return_slots(key_id, spare)

    async def run(self) -> None:
        """:meth:`sweep` every :data:`IDLE_SLOTS_S`, and once more when stopped."""
        try:
            while True:
                await self._clock.sleep(IDLE_SLOTS_S)
                await self.sweep()
        finally:
            await self.sweep()

    async def return_slots(self, key_id: str, slots: int) -> None:
        """Give ``slots`` free concurrency slots back to the store, never cut off by a cancel
        of the request that ended; kept here when the store cannot take them (used by the next
        request, or given back when it ends)."""
        try:
            await asyncio.shield(self._store.return_slots(key_id, slots))
        except StoreError as exc:
            lease = self._leases.get(key_id)
            if lease is not None and lease.concurrent:
                lease.slots += slots
            log.warning("concurrency slots of key %s kept: %s", key_id, exc.message)

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

    def _current_windows(self) -> Windows:
        """The windows of now: :meth:`_windows`, looked at again only once the minute they were
        made in has passed on the monotonic clock (a clock read per request, not a datetime)."""
        if self._clock.monotonic() < self._minute_ends:
            made = self._minute[1]
            assert made is not None
            return made
        now = self._clock.now()
        made = self._windows(now)
        self._minute_ends = self._clock.monotonic() + seconds_to_next_minute(now)
        return made

    def _windows(self, now: datetime) -> Windows:
        """``windows(now)``, made once a minute (two ``strftime`` per keyed request else)."""
        minute = minute_of(now)
        made = self._minute[1]
        if made is None or self._minute[0] != minute:
            made = windows(now)
            self._minute = (minute, made)
        return made

    def __repr__(self) -> str:
        return f"<Quota sampled={len(self._sampled)}>"


def prices_of(config: Callable[[], GatewayConfig]) -> Callable[[str], Price | None]:
    """A model's price from the config's ``models:`` entries (``price``), or None."""

    table: list[Any] = [None, {}]  # the config the prices were read from, and its prices

    def price(model: str) -> Price | None:
        current = config()
        if table[0] is not current:  # a new config version: read its prices once
            table[:] = [current, _prices_in(current)]
        found: Price | None = table[1].get(model)
        return found

    return price


def _prices_in(config: GatewayConfig) -> dict[str, Price]:
    """Each priced model's price (a dict lookup per request, not a walk of ``models:``)."""
    return {
        m.name: Price(m.price.prompt_per_1k_cents, m.price.completion_per_1k_cents)
        for m in config.models
        if m.price is not None
    }
