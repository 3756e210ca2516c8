"""The jobs of the PostgreSQL store: a mixin of :class:`gpugate.store.postgres.PostgresStore`.

Many replicas share the table, and the database settles every race:

* creation is ``INSERT ... ON CONFLICT DO NOTHING`` on the unique idempotency key (a racing
  insert waits for the first to commit, then does nothing), then a read of the existing job;
* a claim is ONE statement: a CTE picks the claimable rows ``FOR UPDATE SKIP LOCKED`` (a row
  another replica is claiming is skipped, not waited for), updates them with a fresh token each
  and appends their ``dispatching`` events (job-store lessons §2-3);
* a fenced write reads the job ``FOR UPDATE`` filtered by its token (a concurrent writer waits,
  then re-checks the filter against the row as committed), then writes the change and its event
  in one statement.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from psycopg.types.json import Jsonb

from gpugate.errors import BadRequest, StoreError
from gpugate.store import jobs_transitions as transitions
from gpugate.store.base import check_limit
from gpugate.store.jobs_base import (
    JOB_STATES,
    JobEvent,
    JobPage,
    JobRecord,
    NewJob,
    check_runtime,
    job_cursor,
    parse_job_cursor,
)
from gpugate.store.jobs_writes import JobWrites

if TYPE_CHECKING:
    from contextlib import AbstractAsyncContextManager

    import psycopg
    from psycopg.rows import TupleRow

    from gpugate.store.jobs_writes import Decide

    Connection = psycopg.AsyncConnection[TupleRow]

_COLUMNS = ", ".join(transitions.JOB_COLUMNS)
_JOBS_COLUMNS = ", ".join(f"jobs.{column}" for column in transitions.JOB_COLUMNS)
_SELECT_JOB = f"SELECT {_COLUMNS} FROM jobs"  # noqa: S608 -- constants only
_LEASED = "state IN ('dispatching', 'running')"
_EVENT_FROM = (
    f"INSERT INTO job_events ({', '.join(transitions.EVENT_COLUMNS)}) "  # noqa: S608 -- constants
    "SELECT id, %(at)s, %(status)s, %(actor)s, %(runtime)s, %(call_id)s, %(error_code)s,"
    " %(detail)s FROM {source}"
)
JOBS_CHANNEL = "gpugate_jobs"
_NOTIFY = f"SELECT pg_notify('{JOBS_CHANNEL}', %(slug)s)"
_INSERT_JOB = f"""
WITH created AS (
    INSERT INTO jobs (slug, idempotency_key, model, class, operation, input, input_ref, runner,
                      state, not_before, allow_external, created_at, updated_at)
    VALUES (%(slug)s, %(idempotency_key)s, %(model)s, %(job_class)s, %(operation)s, %(input)s,
            %(input_ref)s, %(runner)s, 'queued', %(not_before)s, %(allow_external)s, %(at)s,
            %(at)s)
    ON CONFLICT DO NOTHING
    RETURNING {_COLUMNS}
), logged AS (
    {_EVENT_FROM.format(source="created")}
)
SELECT {_COLUMNS} FROM created"""  # noqa: S608 -- constants only; values are bound
_CLAIM = f"""
WITH picked AS (
    SELECT id FROM jobs
    WHERE state = 'queued'
      AND (not_before IS NULL OR not_before <= %(now)s)
      AND (lease_expires_at IS NULL OR lease_expires_at <= %(now)s)
      {{only}}
    ORDER BY id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), numbered AS (
    SELECT id, row_number() OVER (ORDER BY id) AS n FROM picked
), claimed AS (
    UPDATE jobs
    SET state = 'dispatching', leased_by = jobs.slug || %(suffix)s,
        lease_token = (%(tokens)s::text[])[numbered.n], lease_expires_at = %(expires_at)s,
        updated_at = %(now)s
    FROM numbered
    WHERE jobs.id = numbered.id
    RETURNING {_JOBS_COLUMNS}
), logged AS (
    INSERT INTO job_events (job_id, at, status, actor, runtime)
    SELECT id, %(now)s, 'dispatching', %(actor)s, runner FROM claimed
)
SELECT {_COLUMNS} FROM claimed ORDER BY id"""  # noqa: S608 -- constants only; values are bound
_SELECT_EVENTS = """
SELECT e.id, j.slug, e.at, e.status, e.actor, e.runtime, e.call_id, e.error_code, e.detail
FROM job_events e JOIN jobs j ON j.id = e.job_id
WHERE j.slug = %(slug)s
ORDER BY e.id"""


class PostgresJobs(JobWrites):
    """The :class:`gpugate.store.base.JobStore` methods of the PostgreSQL store."""

    if TYPE_CHECKING:

        def _transaction(self) -> AbstractAsyncContextManager[Connection]: ...

    async def create_job(self, new: NewJob) -> tuple[JobRecord, bool]:
        slug = new.slug or transitions.new_slug()
        params = {
            "slug": slug,
            "idempotency_key": new.idempotency_key,
            "model": new.model,
            "job_class": new.job_class,
            "operation": new.operation,
            "input": Jsonb(new.input),
            "input_ref": new.input_ref,
            "runner": new.runner,
            "not_before": new.not_before,
            "allow_external": new.allow_external,
        }
        params |= _event_params(self._clock.now(), transitions.created_event(new.runner))
        async with self._transaction() as conn:
            row = await (await conn.execute(_INSERT_JOB, params)).fetchone()
            if row is not None:
                await conn.execute(_NOTIFY, {"slug": slug})  # delivered at commit
                return _job(row), True
            if new.idempotency_key is not None:
                sql = f"{_SELECT_JOB} WHERE idempotency_key = %(idempotency_key)s"
                existing = await (await conn.execute(sql, params)).fetchone()
                if existing is not None:
                    return _job(existing), False
        raise BadRequest(f"job slug {slug!r} is taken")

    async def get_job(self, slug: str) -> JobRecord | None:
        async with self._transaction() as conn:
            cursor = await conn.execute(f"{_SELECT_JOB} WHERE slug = %(slug)s", {"slug": slug})
            row = await cursor.fetchone()
        return None if row is None else _job(row)

    async def job_events(self, slug: str) -> list[JobEvent]:
        async with self._transaction() as conn:
            cursor = await conn.execute(_SELECT_EVENTS, {"slug": slug})
            return [_event(row) for row in await cursor.fetchall()]

    async def list_jobs(
        self,
        *,
        state: str | None = None,
        runner: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> JobPage:
        if state is not None and state not in JOB_STATES:
            raise ValueError(f"unknown job state {state!r}: expected one of {JOB_STATES}")
        params = {"state": state, "runner": runner, "limit": check_limit(limit) + 1}
        params["before_id"] = None if cursor is None else parse_job_cursor(cursor)
        sql = f"{_SELECT_JOB} WHERE true"
        sql += "" if state is None else " AND state = %(state)s"
        sql += "" if runner is None else " AND runner = %(runner)s"
        sql += "" if cursor is None else " AND id < %(before_id)s"
        sql += " ORDER BY id DESC LIMIT %(limit)s"
        jobs = await self._jobs(sql, params)
        if len(jobs) <= limit:
            return JobPage(jobs, None)
        return JobPage(jobs[:limit], job_cursor(jobs[limit - 1].id))

    async def claim_jobs(
        self, *, limit: int, lease_s: float, now: datetime | None = None
    ) -> list[JobRecord]:
        at = self._clock.now() if now is None else now
        return await self._claim("", at, check_limit(limit), lease_s, {})

    async def claim_job(self, slug: str, *, lease_s: float) -> JobRecord | None:
        only = "AND slug = %(slug)s"
        claimed = await self._claim(only, self._clock.now(), 1, lease_s, {"slug": slug})
        return claimed[0] if claimed else None

    async def expired_leases(
        self, *, now: datetime | None = None, limit: int = 100
    ) -> list[JobRecord]:
        at = self._clock.now() if now is None else now
        sql = f"""{_SELECT_JOB}
            WHERE lease_expires_at IS NOT NULL AND lease_expires_at <= %(now)s AND {_LEASED}
            ORDER BY lease_expires_at, id LIMIT %(limit)s"""
        return await self._jobs(sql, {"now": at, "limit": check_limit(limit)})

    async def count_leased(self, runtime: str) -> int:
        check_runtime(runtime)
        # lease_expires_at is set on every leased row: the condition selects the partial index
        sql = f"""SELECT count(*) FROM jobs
            WHERE lease_expires_at IS NOT NULL AND {_LEASED}
              AND starts_with(leased_by, %(prefix)s)"""  # noqa: S608 -- constants only
        return await self._count(sql, {"prefix": f"{runtime}:"})

    async def queue_depth(self, runtime: str) -> int:
        sql = "SELECT count(*) FROM jobs WHERE runner = %(runner)s AND state = 'queued'"
        return await self._count(sql, {"runner": runtime})

    async def _claim(
        self, only: str, now: datetime, limit: int, lease_s: float, extra: dict[str, Any]
    ) -> list[JobRecord]:
        params = {
            "now": now,
            "limit": limit,
            "suffix": transitions.DISPATCHER_SUFFIX,
            "tokens": [transitions.new_lease_token() for _ in range(limit)],
            "expires_at": now + timedelta(seconds=transitions.check_lease_s(lease_s)),
            "actor": transitions.CLAIM_ACTOR,
        }
        return await self._jobs(_CLAIM.format(only=only), params | extra)

    async def _jobs(self, sql: str, params: dict[str, Any]) -> list[JobRecord]:
        async with self._transaction() as conn:
            cursor = await conn.execute(sql, params)
            return [_job(row) for row in await cursor.fetchall()]

    async def _count(self, sql: str, params: dict[str, Any]) -> int:
        async with self._transaction() as conn:
            row = await (await conn.execute(sql, params)).fetchone()
        if row is None:
            raise StoreError("count(*) returned no row")
        return int(row[0])

    async def _change_leased(
        self, slug: str, token: str, now: datetime, decide: Decide
    ) -> JobRecord | None:
        sql = f"""{_SELECT_JOB}
            WHERE slug = %(slug)s AND lease_token = %(token)s AND {_LEASED} FOR UPDATE"""
        return await self._change(sql, {"slug": slug, "token": token}, now, decide)

    async def _change_job(self, slug: str, now: datetime, decide: Decide) -> JobRecord | None:
        return await self._change(
            f"{_SELECT_JOB} WHERE slug = %(slug)s FOR UPDATE", {"slug": slug}, now, decide
        )

    async def _change(
        self, sql: str, params: dict[str, Any], now: datetime, decide: Decide
    ) -> JobRecord | None:
        async with self._transaction() as conn:
            row = await (await conn.execute(sql, params)).fetchone()
            if row is None:
                return None
            job = _job(row)
            return await _apply(conn, job, decide(job), now)


async def _apply(
    conn: Connection, job: JobRecord, change: transitions.Change, now: datetime
) -> JobRecord:
    """Write ``change`` to the (locked) row and append its event, in one statement."""
    if not change.values:
        return job
    event = change.event
    params: dict[str, Any] = {"id": job.id}
    params |= {f"v_{name}": _encode(name, value) for name, value in change.values.items()}
    if event is not None:
        params |= _event_params(now, event)
    sets = ", ".join(f"{name} = %(v_{name})s" for name in change.values)
    sql = f"UPDATE jobs SET {sets} WHERE id = %(id)s RETURNING {_COLUMNS}"  # noqa: S608
    if event is not None:
        logged = _EVENT_FROM.format(source="changed")
        sql = f"WITH changed AS ({sql}), logged AS ({logged}) SELECT {_COLUMNS} FROM changed"  # noqa: S608
    row = await (await conn.execute(sql, params)).fetchone()
    if row is None:
        raise StoreError(f"job {job.slug} vanished while locked")
    return _job(row)


def _event_params(at: datetime, event: transitions.EventDraft) -> dict[str, Any]:
    return {
        "at": at,
        "status": event.status,
        "actor": event.actor,
        "runtime": event.runtime,
        "call_id": event.call_id,
        "error_code": event.error_code,
        "detail": Jsonb(event.detail),
    }


def _encode(name: str, value: Any) -> Any:
    if value is not None and name in transitions.JSON_FIELDS:
        return Jsonb(value)
    return value


def _decode(name: str, value: Any) -> Any:
    if isinstance(value, datetime):
        return value.astimezone(UTC)
    if name == "cost_cents" and value is not None:
        return float(value)
    return value


def _job(row: TupleRow) -> JobRecord:
    return JobRecord(*map(_decode, transitions.JOB_FIELDS, row))


def _event(row: TupleRow) -> JobEvent:
    id_, slug, at, status, actor, runtime, call_id, error_code, detail = row
    return JobEvent(
        id_, slug, at.astimezone(UTC), status, actor, runtime, call_id, error_code, detail
    )
