"""What the store keeps of spend and call slots (DESIGN §5 Guardrails): its values and its
methods, once for both backends.

* **A reservation** (:meth:`LedgerStore.reserve_call`), taken by the dispatcher before each
  submit to a runtime with a budget or a ``max_concurrency``, in ONE transaction:

  - the call slot: the job's ``leased_by`` becomes ``<runtime>:`` +
    :data:`~gpugate.core.lease.RESERVED_CALL` only when fewer than ``max_concurrency`` calls
    of the runtime are leased. Calls are counted under a per-runtime lock (PostgreSQL: an
    advisory transaction lock; SQLite: the single writer), so two replicas can never both
    take the last slot. The slot is held by the job row itself: it frees when the job's call
    ends, however it ends, with nothing to release.
  - the budget: today's spend row (``spend_days``) grows by the estimate only while the total
    before it is below the limit (``2 x daily_cents``; :meth:`~gpugate.core.budget.Cost.admits`:
    the call that crosses it is the day's last) — one conditional upsert that serialises on
    the row — and the ledger entry (``reserved``, ``estimated``) is written with it.

* **Settlement** (:meth:`LedgerStore.settle_ledger`): an entry whose job no longer holds the
  lease token it was reserved under belongs to a call that ended. It is settled at the cost the
  runtime reported (``reported``) or the call's duration x ``cents_per_second`` (``estimated``)
  when the job completed on that runtime, and released (0 cents) otherwise (the submit failed,
  the call was lost, cancelled or failed); today's spend moves by the difference.

* **The soft cap**: :meth:`LedgerStore.mark_soft_cap` records, once per runtime and UTC day, that
  the day's spend reached ``daily_cents``, with its audit event, in one transaction.

Both races are settled by the database, for every replica at once: the count and the slot's
mark on the job row are one step under the lock, and a reservation waiting for the spend row's
lock re-checks the condition against the committed total, so no check-then-act window is left.
A reservation that cannot be completed rolls its transaction back, so it leaves nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from gpugate.core.budget import Cost, Reserved
from gpugate.core.job_states import check_runtime
from gpugate.core.lease import Lease
from gpugate.store.audit import insert_audit
from gpugate.store.base import AuditEvent, check_limit
from gpugate.store.dialect import only_postgres, sql
from gpugate.store.runtime_state import runtime_subject
from gpugate.store.tx import Driven, Rollback, first, read, rows, run

if TYPE_CHECKING:
    from datetime import date, datetime

    from gpugate.store.tx import Codec, Tx

SOFT_CAP_ACTION = "runtime.soft_cap"
"""Audit action written (once per runtime and UTC day) when today's spend reaches daily_cents."""


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    """One call's charge: ``reserved`` (the estimate), ``settled`` or ``released`` (0)."""

    id: int
    runtime: str
    day: date
    slug: str
    call_id: str | None
    cents: float
    source: str
    state: str
    at: datetime
    settled_at: datetime | None


@dataclass(frozen=True, slots=True)
class SpendDay:
    """A runtime's spend on one UTC day: settled costs plus open reservations."""

    day: date
    cents: float


# Pinned to (state, id) on SQLite: with ANALYZE's per-state averages it preferred a full scan,
# although leased jobs are few next to the finished ones. Every leased row has an expiry (the
# jobs_lease partial index on PostgreSQL).
COUNT_LEASED = sql("""
SELECT count(*) FROM jobs INDEXED BY jobs_claim
WHERE lease_expires_at IS NOT NULL AND state IN ('dispatching', 'running')
  AND lease_runtime = :runtime AND lease_kind IN ('call', 'reservation')""")
"""The calls (and reserved slots) of ``:runtime`` that are leased."""
_LOCK_SLOTS = only_postgres("SELECT pg_advisory_xact_lock(hashtextextended(:lock, 0))")
_HOLDS = sql("""
SELECT id FROM jobs
WHERE slug = :slug AND lease_token = :token AND state IN ('dispatching', 'running')""")
_MARK_SLOT = sql("""
UPDATE jobs SET leased_by = :marker, lease_kind = 'reservation', lease_runtime = :runtime
WHERE slug = :slug AND lease_token = :token AND state IN ('dispatching', 'running')
RETURNING id""")
# Admitted while the spend BEFORE it is below the limit (core.budget: Cost.admits); the
# first reservation of a day finds no row, a spend of 0.
_ADD_SPEND = sql("""
INSERT INTO spend_days AS s (runtime, day, cents)
SELECT :runtime, :day, :cents WHERE 0 < :refuse_at
ON CONFLICT (runtime, day) DO UPDATE SET cents = s.cents + excluded.cents
WHERE s.cents < :refuse_at
RETURNING cents""")
_INSERT_ENTRY = sql("""
INSERT INTO ledger (runtime, day, slug, lease_token, cents, estimated_cents, cents_per_second,
                    source, state, at)
VALUES (:runtime, :day, :slug, :token, :cents, :cents, :rate, 'estimated', 'reserved', :now)""")
_UNMARK_SLOT = sql("""
UPDATE jobs SET leased_by = slug || :holder, lease_kind = 'claim', lease_runtime = NULL,
    lease_replica = :replica
WHERE slug = :slug AND lease_token = :token AND lease_kind = 'reservation'
  AND lease_runtime = :runtime AND state IN ('dispatching', 'running')""")
_OPEN_ENTRY = sql("""
SELECT id, day, estimated_cents FROM ledger
WHERE slug = :slug AND lease_token = :token AND runtime = :runtime AND state = 'reserved'
FOR UPDATE""")
_ENDED = sql("""
SELECT e.id, e.runtime, e.day, e.slug, e.estimated_cents, e.cents_per_second, e.at,
       j.id, j.state, j.cost_cents, j.finished_at,
       e.id = (SELECT max(l.id) FROM ledger l WHERE l.slug = e.slug AND l.runtime = e.runtime)
FROM ledger e INDEXED BY ledger_state JOIN jobs j ON j.slug = e.slug
WHERE e.state = 'reserved'
  AND NOT (j.lease_token IS NOT DISTINCT FROM e.lease_token
           AND j.state IN ('dispatching', 'running'))
ORDER BY e.id LIMIT :limit
FOR UPDATE OF e SKIP LOCKED""")
_COMPLETED_ON = sql("""
SELECT call_id FROM job_events
WHERE job_id = :job_id AND status = 'completed' AND runtime = :runtime
ORDER BY id DESC LIMIT 1""")
_SUBMITTED_ON = sql("""
SELECT call_id FROM job_events
WHERE job_id = :job_id AND status = 'submitted' AND runtime = :runtime AND at >= :at
ORDER BY id LIMIT 1""")
_SETTLE = sql("""
UPDATE ledger SET cents = :cents, source = :source, state = :state, settled_at = :now,
                  call_id = :call_id
WHERE id = :id""")
_MOVE_SPEND = sql("""
UPDATE spend_days SET cents = greatest(0, cents + :delta)
WHERE runtime = :runtime AND day = :day""")
_DAYS = sql("SELECT runtime, day, cents FROM spend_days WHERE day >= :since ORDER BY runtime, day")
_ENTRIES = sql("""
SELECT id, runtime, day, slug, call_id, cents, source, state, at, settled_at FROM ledger
WHERE runtime = :runtime ORDER BY id DESC LIMIT :limit""")
_MARK_SOFT_CAP = sql("""
UPDATE spend_days SET soft_cap_at = :now
WHERE runtime = :runtime AND day = :day AND soft_cap_at IS NULL AND cents >= :daily
RETURNING cents""")


def _reserve(p: dict[str, Any], max_concurrency: int | None, cost: Cost | None) -> Tx[Reserved]:
    if max_concurrency is not None:
        yield from run(_LOCK_SLOTS, p)
    if (yield from first(_HOLDS, p)) is None:
        return "stale"
    if max_concurrency is not None and (yield from rows(COUNT_LEASED, p))[0][0] >= max_concurrency:
        return "at_capacity"
    if cost is not None:
        if (yield from first(_ADD_SPEND, p)) is None:
            return "over_budget"
        yield from run(_INSERT_ENTRY, p)
    if max_concurrency is not None and (yield from first(_MARK_SLOT, p)) is None:
        raise Rollback("stale")
    return "reserved"


def _release(params: dict[str, Any], now: datetime) -> Tx[None]:
    yield from run(_UNMARK_SLOT, params)
    for entry_id, day, estimated in (yield from rows(_OPEN_ENTRY, params)):
        entry = (entry_id, params["runtime"], day, estimated)
        yield from _settle(entry, 0.0, None, now)


def _settle_ended(c: Codec, limit: int, now: datetime) -> Tx[int]:
    """Settle each entry whose call ended: charged when the job completed on its runtime (the
    runtime's latest entry for the job), released otherwise."""
    ended = yield from rows(_ENDED, {"limit": limit})
    for row in ended:
        entry_id, runtime, day, _slug, estimated, rate, at, job_id, state, cost, finished, last = (
            row
        )
        where = {"job_id": job_id, "runtime": runtime, "at": at}
        entry = (entry_id, runtime, day, estimated)
        done = None
        if state == "completed" and last:
            done = yield from first(_COMPLETED_ON, where)
        if done is not None:
            if cost is not None:
                cents, source = float(cost), "reported"
            else:
                seconds = (c.time(finished) - c.time(at)).total_seconds()
                cents, source = max(0.0, seconds) * rate, "estimated"
            yield from _settle(entry, cents, done[0], now, source=source)
            continue
        submitted = yield from first(_SUBMITTED_ON, where)
        yield from _settle(entry, 0.0, None if submitted is None else submitted[0], now)
    return len(ended)


def _settle(
    entry: tuple[int, str, Any, float],
    cents: float,
    call_id: str | None,
    now: datetime,
    *,
    source: str | None = None,
) -> Tx[None]:
    """Charge ``cents`` (``source`` given: settled) or release ``entry`` (``source`` None);
    today's spend moves by the difference from the estimate."""
    entry_id, runtime, day, estimated = entry
    state = "released" if source is None else "settled"
    params = {"id": entry_id, "cents": cents, "source": source or "estimated", "state": state}
    yield from run(_SETTLE, params | {"now": now, "call_id": call_id})
    yield from run(_MOVE_SPEND, {"runtime": runtime, "day": day, "delta": cents - estimated})


def _mark_soft_cap(c: Codec, params: dict[str, Any]) -> Tx[bool]:
    row = yield from first(_MARK_SOFT_CAP, params)
    if row is None:
        return False
    day = params["day"].isoformat()
    detail = {"day": day, "cents": row[0], "daily_cents": params["daily"]}
    event = AuditEvent("gateway", SOFT_CAP_ACTION, runtime_subject(params["runtime"]), detail)
    yield from insert_audit(c, params["now"], event)
    return True


class LedgerStore(Driven, Protocol):
    """The guardrails part of :class:`gpugate.store.Store`."""

    async def reserve_call(
        self,
        slug: str,
        token: str,
        runtime: str,
        *,
        max_concurrency: int | None,
        cost: Cost | None,
    ) -> Reserved:
        """Take a call slot (``max_concurrency`` not None) and reserve ``cost`` (not None) for
        the job holding ``token``, both or neither, atomically across replicas (module doc)."""
        check_runtime(runtime)
        now = self._clock.now()
        params: dict[str, Any] = {"slug": slug, "token": token, "runtime": runtime}
        params["marker"] = Lease.reservation(runtime).text(slug)
        params |= {"lock": f"gpugate.slots:{runtime}", "day": now.date(), "now": now}
        if cost is not None:
            params |= {"cents": cost.estimate_cents, "rate": cost.cents_per_second}
            params["refuse_at"] = cost.refuse_at_cents
        return await self._transact(_reserve(params, max_concurrency, cost))

    async def release_call(self, slug: str, token: str, runtime: str) -> None:
        """The submit after a reservation failed: the slot goes back (``leased_by`` is the
        dispatcher's again) and the open entry of this lease on ``runtime`` is released."""
        check_runtime(runtime)
        params = {"slug": slug, "token": token, "runtime": runtime}
        params |= {"holder": self._holder, "replica": self._replica}
        await self._transact(_release(params, self._clock.now()))

    async def settle_ledger(self, *, limit: int = 500) -> int:
        """Settle or release up to ``limit`` entries whose call ended; how many."""
        now = self._clock.now()
        return await self._transact(_settle_ended(self._codec, check_limit(limit), now))

    async def spend_days(self, since: date) -> dict[str, list[SpendDay]]:
        """Every runtime's spend per day from ``since`` on, oldest first."""
        days: dict[str, list[SpendDay]] = {}
        for runtime, day, cents in await self._query(rows(_DAYS, {"since": since})):
            days.setdefault(runtime, []).append(SpendDay(self._codec.day(day), cents))
        return days

    async def ledger_entries(self, runtime: str, *, limit: int = 50) -> list[LedgerEntry]:
        """``runtime``'s latest entries, newest first."""
        params = {"runtime": runtime, "limit": check_limit(limit)}
        found = await self._query(rows(_ENTRIES, params))
        return [read(self._codec, LedgerEntry, row) for row in found]

    async def mark_soft_cap(self, runtime: str, day: date, daily_cents: float) -> bool:
        """When ``runtime``'s spend on ``day`` reached ``daily_cents`` and was not marked yet:
        mark it and append the :data:`SOFT_CAP_ACTION` audit event (one transaction); True
        only for the call that marked it (once per runtime and day, across replicas)."""
        params = {"runtime": runtime, "day": day, "daily": daily_cents, "now": self._clock.now()}
        return await self._transact(_mark_soft_cap(self._codec, params))
