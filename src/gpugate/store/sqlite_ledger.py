"""The spend ledger and call slots of the SQLite store: a mixin of
:class:`gpugate.store.sqlite.SqliteStore`.

Every method is one hop to the store's thread; writes run under ``BEGIN IMMEDIATE``, so the
checks (calls leased, today's spend) and the writes that depend on them are one transaction no
other writer — in this process or another on the same file — can interleave with.
"""

from __future__ import annotations

from datetime import date, datetime
from typing import TYPE_CHECKING, Any, TypeVar

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
from gpugate.store.runtime_state import runtime_subject
from gpugate.store.sqlite_audit import insert_audit
from gpugate.store.sqlite_codec import text_time, time_text
from gpugate.store.sqlite_jobs import COUNT_LEASED

if TYPE_CHECKING:
    import sqlite3
    from collections.abc import Callable

    from gpugate.clock import Clock

T = TypeVar("T")

_LEASED = "state IN ('dispatching', 'running')"
_HOLDS = f"SELECT id FROM jobs WHERE slug = :slug AND lease_token = :token AND {_LEASED}"  # noqa: S608
_MARK_SLOT = "UPDATE jobs SET leased_by = :marker WHERE id = :id"
_SPENT = "SELECT cents FROM spend_days WHERE runtime = :runtime AND day = :day"
_ADD_SPEND = """
INSERT INTO spend_days (runtime, day, cents) VALUES (:runtime, :day, :cents)
ON CONFLICT (runtime, day) DO UPDATE SET cents = cents + excluded.cents"""
_INSERT_ENTRY = """
INSERT INTO ledger (runtime, day, slug, lease_token, cents, estimated_cents, cents_per_second,
                    source, state, at)
VALUES (:runtime, :day, :slug, :token, :cents, :cents, :rate, 'estimated', 'reserved', :now)"""
_UNMARK_SLOT = f"""
UPDATE jobs SET leased_by = slug || :holder
WHERE slug = :slug AND lease_token = :token AND leased_by = :marker AND {_LEASED}"""  # noqa: S608
_OPEN_ENTRY = """
SELECT id, day, estimated_cents FROM ledger
WHERE slug = :slug AND lease_token = :token AND runtime = :runtime AND state = 'reserved'"""
_ENDED = f"""
SELECT e.id, e.runtime, e.day, e.slug, e.estimated_cents, e.cents_per_second, e.at,
       j.id, j.state, j.cost_cents, j.finished_at,
       e.id = (SELECT max(l.id) FROM ledger l WHERE l.slug = e.slug AND l.runtime = e.runtime)
FROM ledger e INDEXED BY ledger_state JOIN jobs j ON j.slug = e.slug
WHERE e.state = 'reserved'
  AND NOT (j.lease_token IS e.lease_token AND j.{_LEASED})
ORDER BY e.id LIMIT :limit"""  # noqa: S608 -- constants only
_COMPLETED_ON = """
SELECT call_id FROM job_events
WHERE job_id = :job_id AND status = 'completed' AND runtime = :runtime
ORDER BY id DESC LIMIT 1"""
_SUBMITTED_ON = """
SELECT call_id FROM job_events
WHERE job_id = :job_id AND status = 'submitted' AND runtime = :runtime AND at >= :at
ORDER BY id LIMIT 1"""
_SETTLE = """
UPDATE ledger SET cents = :cents, source = :source, state = :state, settled_at = :now,
                  call_id = :call_id
WHERE id = :id"""
_MOVE_SPEND = (
    "UPDATE spend_days SET cents = max(0, cents + :delta) WHERE runtime = :runtime AND day = :day"
)
_DAYS = "SELECT runtime, day, cents FROM spend_days WHERE day >= :since ORDER BY runtime, day"
_ENTRIES = """
SELECT id, runtime, day, slug, call_id, cents, source, state, at, settled_at FROM ledger
WHERE runtime = :runtime ORDER BY id DESC LIMIT :limit"""
_MARK_SOFT_CAP = """
UPDATE spend_days SET soft_cap_at = :now
WHERE runtime = :runtime AND day = :day AND soft_cap_at IS NULL AND cents >= :daily
RETURNING cents"""


class SqliteLedger:
    """The :class:`gpugate.store.ledger.LedgerStore` methods of the SQLite store."""

    _clock: Clock

    if TYPE_CHECKING:
        _holder: str  # the leased_by tail of this store's claims (NamedReplica)

        async def _read(self, work: Callable[[sqlite3.Connection], T]) -> T: ...

        async def _write(self, work: Callable[[sqlite3.Connection], T]) -> T: ...

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
        params |= {"day": now.date().isoformat(), "now": time_text(now)}

        def work(conn: sqlite3.Connection) -> Reserved:
            held = conn.execute(_HOLDS, params).fetchone()
            if held is None:
                return "stale"
            if (
                max_concurrency is not None
                and conn.execute(COUNT_LEASED, params).fetchone()[0] >= max_concurrency
            ):
                return "at_capacity"
            if cost is not None:
                spent = conn.execute(_SPENT, params).fetchone()
                if not cost.fits(0.0 if spent is None else spent[0]):
                    return "over_budget"
                charge = params | {"cents": cost.estimate_cents, "rate": cost.cents_per_second}
                conn.execute(_ADD_SPEND, charge)
                conn.execute(_INSERT_ENTRY, charge)
            if max_concurrency is not None:
                conn.execute(_MARK_SLOT, {"id": held[0], "marker": params["marker"]})
            return "reserved"

        return await self._write(work)

    async def release_call(self, slug: str, token: str, runtime: str) -> None:
        check_runtime(runtime)
        now = time_text(self._clock.now())
        params = {"slug": slug, "token": token, "runtime": runtime}
        params |= {"marker": f"{runtime}:{RESERVED_CALL}", "holder": self._holder}

        def work(conn: sqlite3.Connection) -> None:
            conn.execute(_UNMARK_SLOT, params)
            for entry_id, day, estimated in conn.execute(_OPEN_ENTRY, params).fetchall():
                _settle(conn, (entry_id, runtime, day, estimated), 0.0, None, now)

        await self._write(work)

    async def settle_ledger(self, *, limit: int = 500) -> int:
        now = self._clock.now()
        params = {"limit": check_limit(limit)}

        def work(conn: sqlite3.Connection) -> int:
            rows = conn.execute(_ENDED, params).fetchall()
            for row in rows:
                _settle_ended(conn, row, now)
            return len(rows)

        return await self._write(work)

    async def spend_days(self, since: date) -> dict[str, list[SpendDay]]:
        def work(conn: sqlite3.Connection) -> dict[str, list[SpendDay]]:
            days: dict[str, list[SpendDay]] = {}
            for runtime, day, cents in conn.execute(_DAYS, {"since": since.isoformat()}):
                days.setdefault(runtime, []).append(SpendDay(date.fromisoformat(day), cents))
            return days

        return await self._read(work)

    async def ledger_entries(self, runtime: str, *, limit: int = 50) -> list[LedgerEntry]:
        params = {"runtime": runtime, "limit": check_limit(limit)}

        def work(conn: sqlite3.Connection) -> list[LedgerEntry]:
            return [_entry(row) for row in conn.execute(_ENTRIES, params)]

        return await self._read(work)

    async def mark_soft_cap(self, runtime: str, day: date, daily_cents: float) -> bool:
        now = time_text(self._clock.now())
        params = {"runtime": runtime, "day": day.isoformat(), "daily": daily_cents, "now": now}

        def work(conn: sqlite3.Connection) -> bool:
            row = conn.execute(_MARK_SOFT_CAP, params).fetchone()
            if row is None:
                return False
            detail = {"day": day.isoformat(), "cents": row[0], "daily_cents": daily_cents}
            event = AuditEvent("gateway", SOFT_CAP_ACTION, runtime_subject(runtime), detail)
            insert_audit(conn, now, event)
            return True

        return await self._write(work)


def _settle_ended(conn: sqlite3.Connection, row: tuple[Any, ...], now: datetime) -> None:
    """Settle one entry whose call ended: charged when the job completed on its runtime (the
    runtime's latest entry for the job), released otherwise."""
    entry_id, runtime, day, _slug, estimated, rate, at, job_id, state, cost, finished, last = row
    where = {"job_id": job_id, "runtime": runtime, "at": at}
    stamp = time_text(now)
    done = conn.execute(_COMPLETED_ON, where).fetchone() if state == "completed" and last else None
    if done is not None:
        if cost is not None:
            cents, source = float(cost), "reported"
        else:
            seconds = max(0.0, (text_time(finished) - text_time(at)).total_seconds())
            cents, source = seconds * rate, "estimated"
        _settle(conn, (entry_id, runtime, day, estimated), cents, done[0], stamp, source=source)
        return
    submitted = conn.execute(_SUBMITTED_ON, where).fetchone()
    call = None if submitted is None else submitted[0]
    _settle(conn, (entry_id, runtime, day, estimated), 0.0, call, stamp)


def _settle(
    conn: sqlite3.Connection,
    entry: tuple[int, str, str, float],
    cents: float,
    call_id: str | None,
    now: str,
    *,
    source: str | None = None,
) -> None:
    """Charge ``cents`` (``source`` given: settled) or release ``entry`` (``source`` None);
    today's spend moves by the difference from the estimate."""
    entry_id, runtime, day, estimated = entry
    state = "released" if source is None else "settled"
    params = {"id": entry_id, "cents": cents, "source": source or "estimated", "state": state}
    conn.execute(_SETTLE, params | {"now": now, "call_id": call_id})
    conn.execute(_MOVE_SPEND, {"runtime": runtime, "day": day, "delta": cents - estimated})


def _entry(row: tuple[Any, ...]) -> LedgerEntry:
    id_, runtime, day, slug, call_id, cents, source, state, at, settled_at = row
    return LedgerEntry(
        id_,
        runtime,
        date.fromisoformat(day),
        slug,
        call_id,
        cents,
        source,
        state,
        text_time(at),
        None if settled_at is None else text_time(settled_at),
    )
