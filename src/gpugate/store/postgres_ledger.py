"""The spend ledger and call slots of the PostgreSQL store: a mixin of
:class:`gpugate.store.postgres.PostgresStore`.

Many replicas reserve at once, and the database settles every race:

* the call slot: the calls of a runtime are counted under a transaction-scoped advisory lock
  keyed by the runtime, so the count and the slot's mark on the job row are one step for every
  replica (the lock is released at commit, when the mark is visible to the next counter);
* the budget: one conditional upsert of today's ``spend_days`` row (``ON CONFLICT DO UPDATE
  ... WHERE cents + estimate <= limit``). A concurrent reservation waits for the row's lock and
  re-checks the condition against the committed total, so no check-then-act window is left;
  the ledger entry is inserted by the same statement.

A reservation that cannot be completed rolls its transaction back, so it leaves nothing.
"""

from __future__ import annotations

from datetime import UTC, date, datetime
from typing import TYPE_CHECKING, Any

from gpugate.store.base import AuditEvent, check_limit
from gpugate.store.jobs_base import check_runtime
from gpugate.store.ledger import (
    RESERVED_CALL,
    SOFT_CAP_ACTION,
    Cost,
    LedgerEntry,
    Reserved,
    SpendDay,
)
from gpugate.store.postgres_audit import insert_audit
from gpugate.store.postgres_jobs import COUNT_LEASED
from gpugate.store.runtime_state import runtime_subject

if TYPE_CHECKING:
    from contextlib import AbstractAsyncContextManager

    import psycopg
    from psycopg.rows import TupleRow

    from gpugate.clock import Clock

    Connection = psycopg.AsyncConnection[TupleRow]

_LEASED = "state IN ('dispatching', 'running')"
_LOCK_SLOTS = "SELECT pg_advisory_xact_lock(hashtextextended(%(lock)s, 0))"
_HOLDS = f"SELECT id FROM jobs WHERE slug = %(slug)s AND lease_token = %(token)s AND {_LEASED}"  # noqa: S608
_MARK_SLOT = f"""UPDATE jobs SET leased_by = %(marker)s
WHERE slug = %(slug)s AND lease_token = %(token)s AND {_LEASED} RETURNING id"""  # noqa: S608
_RESERVE = """
WITH spent AS (
    INSERT INTO spend_days AS s (runtime, day, cents)
    SELECT %(runtime)s, %(day)s, %(cents)s WHERE %(cents)s <= %(limit)s
    ON CONFLICT (runtime, day) DO UPDATE SET cents = s.cents + excluded.cents
    WHERE s.cents + excluded.cents <= %(limit)s
    RETURNING cents
)
INSERT INTO ledger (runtime, day, slug, lease_token, cents, estimated_cents, cents_per_second,
                    source, state, at)
SELECT %(runtime)s, %(day)s, %(slug)s, %(token)s, %(cents)s, %(cents)s, %(rate)s,
       'estimated', 'reserved', %(now)s
FROM spent
RETURNING id"""
_UNMARK_SLOT = f"""
UPDATE jobs SET leased_by = slug || %(holder)s
WHERE slug = %(slug)s AND lease_token = %(token)s AND leased_by = %(marker)s AND {_LEASED}"""  # noqa: S608
_OPEN_ENTRY = """
SELECT id, day, estimated_cents FROM ledger
WHERE slug = %(slug)s AND lease_token = %(token)s AND runtime = %(runtime)s
  AND state = 'reserved'
FOR UPDATE"""
_ENDED = f"""
SELECT e.id, e.runtime, e.day, e.slug, e.estimated_cents, e.cents_per_second, e.at,
       j.id, j.state, j.cost_cents, j.finished_at,
       e.id = (SELECT max(l.id) FROM ledger l WHERE l.slug = e.slug AND l.runtime = e.runtime)
FROM ledger e JOIN jobs j ON j.slug = e.slug
WHERE e.state = 'reserved'
  AND NOT (j.lease_token IS NOT DISTINCT FROM e.lease_token AND j.{_LEASED})
ORDER BY e.id LIMIT %(limit)s
FOR UPDATE OF e SKIP LOCKED"""  # noqa: S608 -- constants only
_COMPLETED_ON = """
SELECT call_id FROM job_events
WHERE job_id = %(job_id)s AND status = 'completed' AND runtime = %(runtime)s
ORDER BY id DESC LIMIT 1"""
_SUBMITTED_ON = """
SELECT call_id FROM job_events
WHERE job_id = %(job_id)s AND status = 'submitted' AND runtime = %(runtime)s AND at >= %(at)s
ORDER BY id LIMIT 1"""
_SETTLE = """
UPDATE ledger SET cents = %(cents)s, source = %(source)s, state = %(state)s,
                  settled_at = %(now)s, call_id = %(call_id)s
WHERE id = %(id)s"""
_MOVE_SPEND = """UPDATE spend_days SET cents = greatest(0, cents + %(delta)s)
WHERE runtime = %(runtime)s AND day = %(day)s"""
_DAYS = "SELECT runtime, day, cents FROM spend_days WHERE day >= %(since)s ORDER BY runtime, day"
_ENTRIES = """
SELECT id, runtime, day, slug, call_id, cents, source, state, at, settled_at FROM ledger
WHERE runtime = %(runtime)s ORDER BY id DESC LIMIT %(limit)s"""
_MARK_SOFT_CAP = """
UPDATE spend_days SET soft_cap_at = %(now)s
WHERE runtime = %(runtime)s AND day = %(day)s AND soft_cap_at IS NULL AND cents >= %(daily)s
RETURNING cents"""


class _Undo(Exception):
    """Raised inside a reservation's transaction to roll it back with ``outcome``."""

    def __init__(self, outcome: Reserved) -> None:
        super().__init__(outcome)
        self.outcome: Reserved = outcome


class PostgresLedger:
    """The :class:`gpugate.store.ledger.LedgerStore` methods of PostgreSQL."""

    _clock: Clock

    if TYPE_CHECKING:
        _holder: str  # the leased_by tail of this store's claims (NamedReplica)

        def _transaction(
            self, *, single: bool = False
        ) -> AbstractAsyncContextManager[Connection]: ...

    async def reserve_call(
        self,
        slug: str,
        token: str,
        runtime: str,
        *,
        max_concurrency: int | None,
        cost: Cost | None,
    ) -> Reserved:
        check_runtime(runtime)
        now = self._clock.now()
        params: dict[str, Any] = {"slug": slug, "token": token, "runtime": runtime}
        params |= {"prefix": f"{runtime}:", "marker": f"{runtime}:{RESERVED_CALL}"}
        params |= {"lock": f"gpugate.slots:{runtime}", "day": now.date(), "now": now}
        if cost is not None:
            params |= {"cents": cost.estimate_cents, "rate": cost.cents_per_second}
            params["limit"] = cost.ceiling_cents
        try:
            async with self._transaction() as conn:
                await _reserve(conn, params, max_concurrency=max_concurrency, cost=cost)
        except _Undo as undo:
            return undo.outcome
        return "reserved"

    async def release_call(self, slug: str, token: str, runtime: str) -> None:
        check_runtime(runtime)
        now = self._clock.now()
        params = {"slug": slug, "token": token, "runtime": runtime}
        params |= {"marker": f"{runtime}:{RESERVED_CALL}", "holder": self._holder}
        async with self._transaction() as conn:
            await conn.execute(_UNMARK_SLOT, params)
            rows = await (await conn.execute(_OPEN_ENTRY, params)).fetchall()
            for entry_id, day, estimated in rows:
                await _settle(conn, (entry_id, runtime, day, estimated), 0.0, None, now)

    async def settle_ledger(self, *, limit: int = 500) -> int:
        now = self._clock.now()
        async with self._transaction() as conn:
            rows = await (await conn.execute(_ENDED, {"limit": check_limit(limit)})).fetchall()
            for row in rows:
                await _settle_ended(conn, row, now)
        return len(rows)

    async def spend_days(self, since: date) -> dict[str, list[SpendDay]]:
        async with self._transaction(single=True) as conn:
            rows = await (await conn.execute(_DAYS, {"since": since})).fetchall()
        days: dict[str, list[SpendDay]] = {}
        for runtime, day, cents in rows:
            days.setdefault(runtime, []).append(SpendDay(day, cents))
        return days

    async def ledger_entries(self, runtime: str, *, limit: int = 50) -> list[LedgerEntry]:
        params = {"runtime": runtime, "limit": check_limit(limit)}
        async with self._transaction(single=True) as conn:
            rows = await (await conn.execute(_ENTRIES, params)).fetchall()
        return [_entry(row) for row in rows]

    async def mark_soft_cap(self, runtime: str, day: date, daily_cents: float) -> bool:
        now = self._clock.now()
        params = {"runtime": runtime, "day": day, "daily": daily_cents, "now": now}
        async with self._transaction() as conn:
            row = await (await conn.execute(_MARK_SOFT_CAP, params)).fetchone()
            if row is None:
                return False
            detail = {"day": day.isoformat(), "cents": row[0], "daily_cents": daily_cents}
            event = AuditEvent("gateway", SOFT_CAP_ACTION, runtime_subject(runtime), detail)
            await insert_audit(conn, now, event)
        return True


async def _reserve(
    conn: Connection, params: dict[str, Any], *, max_concurrency: int | None, cost: Cost | None
) -> None:
    """The reservation's statements; raises :class:`_Undo` to roll back with an outcome."""
    if max_concurrency is not None:
        await conn.execute(_LOCK_SLOTS, params)
    if await (await conn.execute(_HOLDS, params)).fetchone() is None:
        raise _Undo("stale")
    if max_concurrency is not None:
        counted = await (await conn.execute(COUNT_LEASED, params)).fetchone()
        if counted is not None and counted[0] >= max_concurrency:
            raise _Undo("at_capacity")
    if cost is not None and await (await conn.execute(_RESERVE, params)).fetchone() is None:
        raise _Undo("over_budget")
    if max_concurrency is not None and (
        await (await conn.execute(_MARK_SLOT, params)).fetchone() is None
    ):
        raise _Undo("stale")


async def _settle_ended(conn: Connection, row: TupleRow, now: datetime) -> None:
    """Settle one entry whose call ended: charged when the job completed on its runtime (the
    runtime's latest entry for the job), released otherwise."""
    entry_id, runtime, day, _slug, estimated, rate, at, job_id, state, cost, finished, last = row
    where = {"job_id": job_id, "runtime": runtime, "at": at}
    entry = (entry_id, runtime, day, estimated)
    done = None
    if state == "completed" and last:
        done = await (await conn.execute(_COMPLETED_ON, where)).fetchone()
    if done is not None:
        if cost is not None:
            cents, source = float(cost), "reported"
        else:
            cents = max(0.0, (finished - at).total_seconds()) * rate
            source = "estimated"
        await _settle(conn, entry, cents, done[0], now, source=source)
        return
    submitted = await (await conn.execute(_SUBMITTED_ON, where)).fetchone()
    await _settle(conn, entry, 0.0, None if submitted is None else submitted[0], now)


async def _settle(
    conn: Connection,
    entry: tuple[int, str, date, float],
    cents: float,
    call_id: str | None,
    now: datetime,
    *,
    source: str | None = None,
) -> None:
    """Charge ``cents`` (``source`` given: settled) or release ``entry`` (``source`` None);
    today's spend moves by the difference from the estimate."""
    entry_id, runtime, day, estimated = entry
    state = "released" if source is None else "settled"
    params = {"id": entry_id, "cents": cents, "source": source or "estimated", "state": state}
    await conn.execute(_SETTLE, params | {"now": now, "call_id": call_id})
    delta = {"runtime": runtime, "day": day, "delta": cents - estimated}
    await conn.execute(_MOVE_SPEND, delta)


def _entry(row: TupleRow) -> LedgerEntry:
    id_, runtime, day, slug, call_id, cents, source, state, at, settled_at = row
    return LedgerEntry(
        id_,
        runtime,
        day,
        slug,
        call_id,
        cents,
        source,
        state,
        at.astimezone(UTC),
        None if settled_at is None else settled_at.astimezone(UTC),
    )
