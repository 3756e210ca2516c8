"""The jobs of the PostgreSQL store: a mixin of :class:`gpugate.store.postgres.PostgresStore`.

Many replicas share the table, and the database settles every race:

* creation is ``INSERT ... ON CONFLICT DO NOTHING`` on the unique idempotency key (a racing
  insert waits for the first to commit, then does nothing), then a read of the existing job;
* a claim is ONE statement: a CTE picks the claimable rows ``FOR UPDATE SKIP LOCKED`` (a row
  another replica is claiming is skipped, not waited for), updates them with a fresh token each
  and appends their ``dispatching`` events (job-store lessons §2-3);
* fenced writes come in group-committed batches (:mod:`gpugate.store.group_commit`): one
  statement locks the batch's jobs ``FOR UPDATE`` in id order (a concurrent writer waits, then
  reads the row as committed; two batches never deadlock), the fence is checked against the row
  as read (so two writes of one job in a batch see each other), and the batch's changes and
  events are written in one statement;
* creations come in batches too: one ``INSERT ... SELECT`` for the batch, its events and its
  ``NOTIFY`` in the same statement.

A batch's rows travel as one JSON document (``jsonb_to_recordset``): one ``json.dumps`` in C,
where psycopg's array dumpers cost a Python call per value. A single statement (a claim, a batch
of creates, a read) runs without ``BEGIN``/``COMMIT``: it is atomic on its own.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from psycopg.types.json import Jsonb

from gpugate.errors import BadRequest, StoreError
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
from gpugate.store.jobs_writes import Created, Creation, JobWrites, LeasedWrite, fenced, written

if TYPE_CHECKING:
    from collections.abc import Sequence
    from contextlib import AbstractAsyncContextManager

    import psycopg
    from psycopg.rows import TupleRow

    from gpugate.store.jobs_writes import Decide

    Connection = psycopg.AsyncConnection[TupleRow]

_COLUMNS = ", ".join(transitions.JOB_COLUMNS)
_JOBS_COLUMNS = ", ".join(f"jobs.{column}" for column in transitions.JOB_COLUMNS)
_SELECT_JOB = f"SELECT {_COLUMNS} FROM jobs"  # noqa: S608 -- constants only
_BY_KEY = f"{_SELECT_JOB} WHERE idempotency_key = %(key)s"
_LEASED = "state IN ('dispatching', 'running')"
# lease_expires_at is set on every leased row: the condition selects the partial index
COUNT_LEASED = f"""SELECT count(*) FROM jobs WHERE lease_expires_at IS NOT NULL AND {_LEASED}
    AND starts_with(leased_by, %(prefix)s)"""  # noqa: S608 -- constants only
"""The calls of a runtime that are leased (``%(prefix)s`` is ``<runtime>:``); the ledger's too."""
_EVENT_FROM = (
    f"INSERT INTO job_events ({', '.join(transitions.EVENT_COLUMNS)}) "  # noqa: S608 -- constants
    "SELECT id, %(at)s, %(status)s, %(actor)s, %(runtime)s, %(call_id)s, %(error_code)s,"
    " %(detail)s FROM {source}"
)
JOBS_CHANNEL = "gpugate_jobs"
_INSERT_JOBS = f"""
WITH wanted AS (
    SELECT * FROM ROWS FROM (jsonb_to_recordset(%(rows)s::jsonb)
        AS (slug text, idempotency_key text, model text, class text, operation text,
            input jsonb, input_ref text, runner text, not_before timestamptz,
            allow_external boolean, at timestamptz)) WITH ORDINALITY
        AS w(slug, idempotency_key, model, class, operation, input, input_ref, runner,
             not_before, allow_external, at, n)
), created AS (
    INSERT INTO jobs (slug, idempotency_key, model, class, operation, input, input_ref, runner,
                      state, not_before, allow_external, created_at, updated_at)
    SELECT slug, idempotency_key, model, class, operation, input, input_ref, runner, 'queued',
           not_before, allow_external, at, at
    FROM wanted ORDER BY n
    ON CONFLICT DO NOTHING
    RETURNING {_COLUMNS}
), logged AS (
    INSERT INTO job_events (job_id, at, status, actor, runtime, detail)
    SELECT id, created_at, 'queued', %(actor)s, runner, '{{}}'::jsonb FROM created
)
SELECT {_COLUMNS}, pg_notify('{JOBS_CHANNEL}', slug) FROM created"""  # noqa: S608 -- constants
_LOCK_JOBS = f"{_SELECT_JOB} WHERE slug = ANY(%(slugs)s) ORDER BY id FOR UPDATE"
_CLAIM = f"""
WITH picked AS (
    SELECT id FROM jobs
    WHERE state = 'queued'
      AND (not_before IS NULL OR not_before <= %(due_by)s)
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
        _holder: str  # the leased_by tail of this store's claims (NamedReplica)

        def _transaction(
            self, *, single: bool = False
        ) -> AbstractAsyncContextManager[Connection]: ...

    async def _create_many(self, creations: Sequence[Creation]) -> list[Created | Exception]:
        news = [c.new for c in creations]
        rows = [
            {
                "slug": c.slug,
                "idempotency_key": c.new.idempotency_key,
                "model": c.new.model,
                "class": c.new.job_class,
                "operation": c.new.operation,
                "input": c.new.input,
                "input_ref": c.new.input_ref,
                "runner": c.new.runner,
                "not_before": _iso(c.new.not_before),
                "allow_external": c.new.allow_external,
                "at": _iso(c.now),
            }
            for c in creations
        ]
        params = {"rows": _json(rows), "actor": transitions.CREATE_ACTOR}
        async with self._transaction(single=True) as conn:
            got = await (await conn.execute(_INSERT_JOBS, params)).fetchall()
            inserted = {job.slug: job for job in (_job(row[:-1]) for row in got)}
            keys = [n.idempotency_key for n in news if n.idempotency_key is not None]
            existing: dict[str | None, JobRecord] = {}
            if len(inserted) < len(creations) and keys:
                sql = f"{_SELECT_JOB} WHERE idempotency_key = ANY(%(keys)s)"
                cursor = await conn.execute(sql, {"keys": keys})
                existing = {job.idempotency_key: job for job in map(_job, await cursor.fetchall())}
        return _creations(creations, inserted, existing)

    async def get_job(self, slug: str) -> JobRecord | None:
        async with self._transaction(single=True) as conn:
            cursor = await conn.execute(f"{_SELECT_JOB} WHERE slug = %(slug)s", {"slug": slug})
            row = await cursor.fetchone()
        return None if row is None else _job(row)

    async def job_by_idempotency_key(self, key: str) -> JobRecord | None:
        async with self._transaction(single=True) as conn:
            cursor = await conn.execute(_BY_KEY, {"key": key})
            row = await cursor.fetchone()
        return None if row is None else _job(row)

    async def job_events(self, slug: str) -> list[JobEvent]:
        async with self._transaction(single=True) as conn:
            cursor = await conn.execute(_SELECT_EVENTS, {"slug": slug})
            return [_event(row) for row in await cursor.fetchall()]

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
        sql = f"{_SELECT_JOB} WHERE true"
        sql += "" if state is None else " AND state = %(state)s"
        sql += "" if runner is None else " AND runner = %(runner)s"
        sql += "" if tenant is None else TENANT_JOBS.format("%(tenant)s")
        sql += "" if cursor is None else " AND id < %(before_id)s"
        sql += " ORDER BY id DESC LIMIT %(limit)s"
        jobs = await self._jobs(sql, params)
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
        at = self._clock.now() if now is None else now
        due = {"due_by": at if due_by is None else due_by}
        return await self._claim("", at, check_limit(limit), lease_s, due)

    async def claim_job(self, slug: str, *, lease_s: float) -> JobRecord | None:
        only = "AND slug = %(slug)s"
        now = self._clock.now()
        claimed = await self._claim(only, now, 1, lease_s, {"slug": slug, "due_by": now})
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
        return await self._count(COUNT_LEASED, {"prefix": f"{runtime}:"})

    async def queue_depth(self, runtime: str) -> int:
        sql = "SELECT count(*) FROM jobs WHERE runner = %(runner)s AND state = 'queued'"
        return await self._count(sql, {"runner": runtime})

    async def _claim(
        self, only: str, now: datetime, limit: int, lease_s: float, extra: dict[str, Any]
    ) -> list[JobRecord]:
        params = {
            "now": now,
            "limit": limit,
            "suffix": self._holder,
            "tokens": transitions.new_lease_tokens(limit),
            "expires_at": now + timedelta(seconds=transitions.check_lease_s(lease_s)),
            "actor": transitions.CLAIM_ACTOR,
        }
        return await self._jobs(_CLAIM.format(only=only), params | extra)

    async def _jobs(self, sql: str, params: dict[str, Any]) -> list[JobRecord]:
        async with self._transaction(single=True) as conn:
            cursor = await conn.execute(sql, params)
            return [_job(row) for row in await cursor.fetchall()]

    async def _count(self, sql: str, params: dict[str, Any]) -> int:
        async with self._transaction(single=True) as conn:
            row = await (await conn.execute(sql, params)).fetchone()
        if row is None:
            raise StoreError("count(*) returned no row")
        return int(row[0])

    async def _change_leased_many(
        self, writes: Sequence[LeasedWrite]
    ) -> list[JobRecord | Exception | None]:
        slugs = list(dict.fromkeys(write.slug for write in writes))
        outcomes: list[JobRecord | Exception | None] = []
        async with self._transaction() as conn:
            cursor = await conn.execute(_LOCK_JOBS, {"slugs": slugs})
            jobs = {job.slug: job for job in map(_job, await cursor.fetchall())}
            batch = _Batch()
            for write in writes:
                job = jobs.get(write.slug)
                if job is None or not fenced(job, write.token):
                    outcomes.append(None)
                    continue
                try:
                    change = write.decide(job)
                    batch.add(job, change, write.now)
                except Exception as exc:  # noqa: BLE001 - this write's own failure is its answer
                    outcomes.append(exc)
                    continue
                job = jobs[write.slug] = written(job, change)
                outcomes.append(job)
            statement = batch.statement(jobs)
            if statement is not None:
                await conn.execute(*statement)
        return outcomes

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


_COLUMN_TYPES = {
    "runner": "text",
    "state": "text",
    "attempts": "jsonb",
    "submit_count": "integer",
    "rescue_count": "integer",
    "leased_by": "text",
    "lease_token": "text",
    "lease_expires_at": "timestamptz",
    "not_before": "timestamptz",
    "result": "jsonb",
    "result_ref": "text",
    "error_code": "text",
    "error_message": "text",
    "cost_cents": "double precision",
    "updated_at": "timestamptz",
    "finished_at": "timestamptz",
}
_EVENT_TYPES = {
    "job_id": "bigint",
    "at": "timestamptz",
    "status": "text",
    "actor": "text",
    "runtime": "text",
    "call_id": "text",
    "error_code": "text",
    "detail": "jsonb",
}
_EVENTS_FROM = (
    f"INSERT INTO job_events ({', '.join(_EVENT_TYPES)}) SELECT {', '.join(_EVENT_TYPES)} "  # noqa: S608
    "FROM ROWS FROM (jsonb_to_recordset(%(events)s::jsonb) AS ("
    + ", ".join(f"{name} {kind}" for name, kind in _EVENT_TYPES.items())
    + f")) WITH ORDINALITY AS e({', '.join(_EVENT_TYPES)}, n) ORDER BY n"
)


class _Batch:
    """The writes of one batch of changes as ONE statement: each job's final values (jobs
    changing the same columns updated together, ``UPDATE ... FROM jsonb_to_recordset(...)``)
    and every event, in order. A JSON ``null`` becomes SQL NULL, as a None did one by one."""

    def __init__(self) -> None:
        self._columns: dict[str, set[str]] = {}  # slug -> the columns its changes set
        self._events: list[dict[str, Any]] = []

    def add(self, job: JobRecord, change: transitions.Change, now: datetime) -> None:
        if not change.values:
            return
        for name in change.values:
            if name not in _COLUMN_TYPES:
                raise ValueError(f"no column type for {name!r}")
        event = change.event
        if event is not None:
            self._events.append(
                {
                    "job_id": job.id,
                    "at": now.isoformat(),
                    "status": event.status,
                    "actor": event.actor,
                    "runtime": event.runtime,
                    "call_id": event.call_id,
                    "error_code": event.error_code,
                    "detail": event.detail,
                }
            )
        self._columns.setdefault(job.slug, set()).update(change.values)

    def statement(self, jobs: dict[str, JobRecord]) -> tuple[str, dict[str, Any]] | None:
        if not self._columns:
            return None
        groups: dict[tuple[str, ...], list[JobRecord]] = {}
        for slug, columns in self._columns.items():
            groups.setdefault(tuple(sorted(columns)), []).append(jobs[slug])
        params: dict[str, Any] = {}
        updates = []
        for n, (names, group) in enumerate(groups.items()):
            rows = [
                {"id": job.id} | {name: _iso(getattr(job, name)) for name in names} for job in group
            ]
            params[f"u{n}"] = _json(rows)
            sets = ", ".join(f"{name} = v.{name}" for name in names)
            types = ", ".join(f"{name} {_COLUMN_TYPES[name]}" for name in names)
            updates.append(
                f"u{n} AS (UPDATE jobs SET {sets}"  # noqa: S608 -- column names are constants
                f" FROM jsonb_to_recordset(%(u{n})s::jsonb) AS v(id bigint, {types})"
                " WHERE jobs.id = v.id)"
            )
        last = "SELECT 1"
        if self._events:
            params["events"] = _json(self._events)
            last = _EVENTS_FROM
        return f"WITH {', '.join(updates)} {last}", params


def _iso(value: Any) -> Any:
    return value.isoformat() if isinstance(value, datetime) else value


def _json(value: Any) -> str:
    """A batch's rows as one JSON document; StoreError for a value JSON cannot hold (as
    psycopg's own Jsonb would), which the group commit then pins on the write at fault."""
    try:
        return json.dumps(value, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise StoreError(f"a job write holds a value JSON cannot hold: {exc}") from exc


def _creations(
    creations: Sequence[Creation],
    inserted: dict[str, JobRecord],
    existing: dict[str | None, JobRecord],
) -> list[Created | Exception]:
    """Each creation's answer: the job it inserted, or the job holding its key, or BadRequest."""
    outcomes: list[Created | Exception] = []
    taken: set[str] = set()
    for creation in creations:
        key = creation.new.idempotency_key
        job = inserted.get(creation.slug)
        if job is not None and job.idempotency_key == key and creation.slug not in taken:
            taken.add(creation.slug)
            outcomes.append((job, True))
        elif key is not None and (job := _inserted_by_key(inserted, key) or existing.get(key)):
            outcomes.append((job, False))
        else:
            outcomes.append(BadRequest(f"job slug {creation.slug!r} is taken"))
    return outcomes


def _inserted_by_key(inserted: dict[str, JobRecord], key: str) -> JobRecord | None:
    return next((job for job in inserted.values() if job.idempotency_key == key), None)


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
