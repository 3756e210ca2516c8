"""The jobs of the SQLite store: a mixin of :class:`gpugate.store.sqlite.SqliteStore`.

Every method is one hop to the store's thread. Writes run under ``BEGIN IMMEDIATE``, which takes
the database's write lock first, so reading a job, deciding (``jobs_transitions``) and writing it
back cannot interleave with any other writer, in this process or another one on the same file:
that is what makes idempotent creation, claims and fenced writes race-free here.
"""

from __future__ import annotations

import json
import sqlite3
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

from gpugate.errors import BadRequest
from gpugate.store import jobs_transitions as transitions
from gpugate.store.base import check_limit
from gpugate.store.jobs_base import (
    JOB_STATES,
    TENANT_JOBS,
    JobEvent,
    JobPage,
    JobRecord,
    check_runtime,
    job_cursor,
    parse_job_cursor,
)
from gpugate.store.jobs_writes import Created, Creation, JobWrites, LeasedWrite, written
from gpugate.store.sqlite_codec import json_text, text_time, time_text

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from datetime import datetime

    from gpugate.store.jobs_writes import Decide

T = TypeVar("T")
Item = TypeVar("Item")

_COLUMNS = ", ".join(transitions.JOB_COLUMNS)
_SELECT_JOB = f"SELECT {_COLUMNS} FROM jobs"  # noqa: S608 -- constants only
_BY_KEY = f"{_SELECT_JOB} WHERE idempotency_key = :idempotency_key"
_LEASED = "state IN ('dispatching', 'running')"
# Pinned to (state, id): with ANALYZE's per-state averages SQLite preferred a full scan,
# although leased jobs are few next to the finished ones.
COUNT_LEASED = f"""SELECT count(*) FROM jobs INDEXED BY jobs_claim WHERE {_LEASED}
    AND substr(leased_by, 1, length(:prefix)) = :prefix"""  # noqa: S608 -- constants only
"""The calls of a runtime that are leased (``:prefix`` is ``<runtime>:``); the ledger's too."""
_CLAIMABLE = f"""
{_SELECT_JOB}
WHERE state = 'queued'
  AND (not_before IS NULL OR not_before <= :due_by)
  AND (lease_expires_at IS NULL OR lease_expires_at <= :now)"""
_INSERT_JOB = f"""
INSERT INTO jobs (slug, idempotency_key, model, class, operation, input, input_ref, runner, state,
                  not_before, allow_external, created_at, updated_at)
VALUES (:slug, :idempotency_key, :model, :job_class, :operation, :input, :input_ref, :runner,
        'queued', :not_before, :allow_external, :now, :now)
ON CONFLICT DO NOTHING
RETURNING {_COLUMNS}"""  # noqa: S608 -- constants only; values are bound
_INSERT_EVENT = (
    f"INSERT INTO job_events ({', '.join(transitions.EVENT_COLUMNS)}) "  # noqa: S608 -- constants
    f"VALUES ({', '.join(':' + name for name in transitions.EVENT_COLUMNS)})"
)
_SELECT_EVENTS = """
SELECT e.id, j.slug, e.at, e.status, e.actor, e.runtime, e.call_id, e.error_code, e.detail
FROM job_events e JOIN jobs j ON j.id = e.job_id
WHERE j.slug = :slug
ORDER BY e.id"""


class SqliteJobs(JobWrites):
    """The :class:`gpugate.store.base.JobStore` methods of the SQLite store."""

    if TYPE_CHECKING:
        _holder: str  # the leased_by tail of this store's claims (NamedReplica)

        async def _read(self, work: Callable[[sqlite3.Connection], T]) -> T: ...

        async def _write(self, work: Callable[[sqlite3.Connection], T]) -> T: ...

    async def _create_many(self, creations: Sequence[Creation]) -> list[Created | Exception]:
        return await self._write(partial(_each, _create, creations))

    async def get_job(self, slug: str) -> JobRecord | None:
        def work(conn: sqlite3.Connection) -> JobRecord | None:
            row = conn.execute(f"{_SELECT_JOB} WHERE slug = :slug", {"slug": slug}).fetchone()
            return None if row is None else _job(row)

        return await self._read(work)

    async def job_by_idempotency_key(self, key: str) -> JobRecord | None:
        def work(conn: sqlite3.Connection) -> JobRecord | None:
            row = conn.execute(_BY_KEY, {"idempotency_key": key}).fetchone()
            return None if row is None else _job(row)

        return await self._read(work)

    async def job_events(self, slug: str) -> list[JobEvent]:
        def work(conn: sqlite3.Connection) -> list[JobEvent]:
            return [_event(row) for row in conn.execute(_SELECT_EVENTS, {"slug": slug})]

        return await self._read(work)

    async def list_jobs(
        self,
        *,
        state: str | None = None,
        runner: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
        tenant: str | None = None,
    ) -> JobPage:
        if state is not None and state not in JOB_STATES:
            raise ValueError(f"unknown job state {state!r}: expected one of {JOB_STATES}")
        params = {"state": state, "runner": runner, "limit": check_limit(limit) + 1}
        params["before_id"] = None if cursor is None else parse_job_cursor(cursor)
        params["tenant"] = tenant
        sql = f"{_SELECT_JOB} WHERE 1 = 1"
        sql += "" if state is None else " AND state = :state"
        sql += "" if runner is None else " AND runner = :runner"
        sql += "" if tenant is None else TENANT_JOBS.format(":tenant")
        sql += "" if cursor is None else " AND id < :before_id"
        sql += " ORDER BY id DESC LIMIT :limit"

        def work(conn: sqlite3.Connection) -> list[JobRecord]:
            return [_job(row) for row in conn.execute(sql, params)]

        jobs = await self._read(work)
        if len(jobs) <= limit:
            return JobPage(jobs, None)
        return JobPage(jobs[:limit], job_cursor(jobs[limit - 1].id))

    async def claim_jobs(
        self,
        *,
        limit: int,
        lease_s: float,
        now: datetime | None = None,
        due_by: datetime | None = None,
    ) -> list[JobRecord]:
        transitions.check_lease_s(lease_s)
        at = self._clock.now() if now is None else now
        due = time_text(at if due_by is None else due_by)
        params = {"now": time_text(at), "due_by": due, "limit": check_limit(limit)}
        sql = f"{_CLAIMABLE} ORDER BY id LIMIT :limit"
        return await self._write(partial(_claim, sql, params, at, lease_s, self._holder))

    async def claim_job(self, slug: str, *, lease_s: float) -> JobRecord | None:
        transitions.check_lease_s(lease_s)
        at = self._clock.now()
        params = {"now": time_text(at), "due_by": time_text(at), "slug": slug}
        sql = f"{_CLAIMABLE} AND slug = :slug"
        claimed = await self._write(partial(_claim, sql, params, at, lease_s, self._holder))
        return claimed[0] if claimed else None

    async def expired_leases(
        self, *, now: datetime | None = None, limit: int = 100
    ) -> list[JobRecord]:
        at = self._clock.now() if now is None else now
        params = {"now": time_text(at), "limit": check_limit(limit)}
        sql = f"""{_SELECT_JOB} WHERE lease_expires_at <= :now AND {_LEASED}
            ORDER BY lease_expires_at, id LIMIT :limit"""

        def work(conn: sqlite3.Connection) -> list[JobRecord]:
            return [_job(row) for row in conn.execute(sql, params)]

        return await self._read(work)

    async def count_leased(self, runtime: str) -> int:
        check_runtime(runtime)
        return await self._count(COUNT_LEASED, {"prefix": f"{runtime}:"})

    async def queue_depth(self, runtime: str) -> int:
        sql = "SELECT count(*) FROM jobs WHERE runner = :runner AND state = 'queued'"
        return await self._count(sql, {"runner": runtime})

    async def _count(self, sql: str, params: dict[str, Any]) -> int:
        return await self._read(lambda conn: int(conn.execute(sql, params).fetchone()[0]))

    async def _change_leased_many(
        self, writes: Sequence[LeasedWrite]
    ) -> list[JobRecord | Exception | None]:
        return await self._write(partial(_each, _change_leased, writes))

    async def _change_job(self, slug: str, now: datetime, decide: Decide) -> JobRecord | None:
        sql = f"{_SELECT_JOB} WHERE slug = :slug"
        return await self._write(partial(_change, sql, {"slug": slug}, now, decide))


def _each(
    work: Callable[[sqlite3.Connection, Item], T], items: Sequence[Item], conn: sqlite3.Connection
) -> list[T | Exception]:
    """``work`` for each item inside the caller's transaction; an item that raises is its own
    answer and the others commit. ``work`` raises only before it writes (it prepares every
    value first), so a failed item leaves nothing behind; SQLite's own errors fail the whole
    transaction (the store turns them into StoreError, and the group commit retries each
    item alone)."""
    outcomes: list[T | Exception] = []
    for item in items:
        try:
            outcomes.append(work(conn, item))
        except sqlite3.Error:
            raise
        except Exception as exc:  # noqa: BLE001 - this item's own failure is its answer
            outcomes.append(exc)
    return outcomes


def _create(conn: sqlite3.Connection, creation: Creation) -> Created:
    new, slug, now = creation.new, creation.slug, creation.now
    params = {
        "slug": slug,
        "idempotency_key": new.idempotency_key,
        "model": new.model,
        "job_class": new.job_class,
        "operation": new.operation,
        "input": json_text(new.input),
        "input_ref": new.input_ref,
        "runner": new.runner,
        "not_before": None if new.not_before is None else time_text(new.not_before),
        "allow_external": int(new.allow_external),
        "now": time_text(now),
    }
    row = conn.execute(_INSERT_JOB, params).fetchone()
    if row is not None:
        job = _job(row)
        _insert_event(conn, job.id, now, transitions.created_event(job.runner))
        return job, True
    if new.idempotency_key is not None:
        existing = conn.execute(_BY_KEY, params).fetchone()
        if existing is not None:
            return _job(existing), False
    raise BadRequest(f"job slug {slug!r} is taken")


def _change_leased(conn: sqlite3.Connection, write: LeasedWrite) -> JobRecord | None:
    sql = f"{_SELECT_JOB} WHERE slug = :slug AND lease_token = :token AND {_LEASED}"
    params = {"slug": write.slug, "token": write.token}
    return _change(sql, params, write.now, write.decide, conn)


def _claim(
    sql: str,
    params: dict[str, Any],
    now: datetime,
    lease_s: float,
    holder: str,
    conn: sqlite3.Connection,
) -> list[JobRecord]:
    rows = conn.execute(sql, params).fetchall()
    claimed = []
    for row, token in zip(rows, transitions.new_lease_tokens(len(rows)), strict=True):
        job = _job(row)
        change = transitions.claim(job, now=now, lease_s=lease_s, token=token, holder=holder)
        claimed.append(_apply(conn, job, change, now))
    return claimed


def _change(
    sql: str, params: dict[str, Any], now: datetime, decide: Decide, conn: sqlite3.Connection
) -> JobRecord | None:
    row = conn.execute(sql, params).fetchone()
    if row is None:
        return None
    job = _job(row)
    return _apply(conn, job, decide(job), now)


def _apply(
    conn: sqlite3.Connection, job: JobRecord, change: transitions.Change, now: datetime
) -> JobRecord:
    """Write ``change`` to the job's row and append its event; the job as written.

    Every value is encoded before the first write, so whatever raises leaves nothing behind.
    """
    if not change.values:
        return job
    sets = ", ".join(f"{name} = :{name}" for name in change.values)
    params = {name: _encode(name, value) for name, value in change.values.items()}
    params["id"] = job.id
    event = None if change.event is None else _event_params(job.id, now, change.event)
    conn.execute(f"UPDATE jobs SET {sets} WHERE id = :id", params)  # noqa: S608 -- columns
    if event is not None:
        conn.execute(_INSERT_EVENT, event)
    return written(job, change)


def _insert_event(
    conn: sqlite3.Connection, job_id: int, at: datetime, event: transitions.EventDraft
) -> None:
    conn.execute(_INSERT_EVENT, _event_params(job_id, at, event))


def _event_params(job_id: int, at: datetime, event: transitions.EventDraft) -> dict[str, Any]:
    return {
        "job_id": job_id,
        "at": time_text(at),
        "status": event.status,
        "actor": event.actor,
        "runtime": event.runtime,
        "call_id": event.call_id,
        "error_code": event.error_code,
        "detail": json_text(event.detail),
    }


def _encode(name: str, value: Any) -> Any:
    if value is None:
        return None
    if name in transitions.JSON_FIELDS:
        return json_text(value)
    if name in transitions.TIME_FIELDS:
        return time_text(value)
    return value


def _decode(name: str, value: Any) -> Any:
    if value is None:
        return None
    if name in transitions.JSON_FIELDS:
        return json.loads(value)
    if name in transitions.TIME_FIELDS:
        return text_time(value)
    if name == "allow_external":
        return bool(value)
    return value


def _job(row: tuple[Any, ...]) -> JobRecord:
    return JobRecord(*map(_decode, transitions.JOB_FIELDS, row))


def _event(row: tuple[Any, ...]) -> JobEvent:
    id_, slug, at, status, actor, runtime, call_id, error_code, detail = row
    return JobEvent(
        id_, slug, text_time(at), status, actor, runtime, call_id, error_code, json.loads(detail)
    )
