"""The durable jobs (:class:`JobStore`), once for both backends; the values it hands back and
takes are the job domain's (:mod:`gpugate.core.job_states`), its writes in
:mod:`gpugate.store.jobs_writes`. Both backends pass the contract suite
``tests/store/test_store_jobs*.py``.

Errors: arguments only a caller's bug can get wrong (an unknown class, state, actor or runtime
id, a non-positive lease, a naive datetime) raise ValueError; what only the store can judge
about a client's input (a taken slug, a malformed cursor) raises
:class:`gpugate.errors.BadRequest`.

Every write reads the jobs it changes under a lock (SQLite: ``BEGIN IMMEDIATE``, the one write
lock; PostgreSQL: ``FOR UPDATE`` in id order, so two batches never deadlock and a concurrent
writer waits, then reads the row as committed), decides in Python (:mod:`jobs_transitions`:
the rule lives once) and writes each job's final row and its events. The writes of a batch go
to the database as one step: SQLite runs one static UPDATE per job on its thread
(``executemany``); PostgreSQL gets the batch as one JSON document (``jsonb_to_recordset``:
one ``json.dumps`` in C, where psycopg's array dumpers cost a Python call per value) in ONE
statement with its events.

Two named PostgreSQL overrides keep the measured speed (bench/jobs.py): the claim is ONE
statement (a CTE picks the rows ``FOR UPDATE SKIP LOCKED`` — a row another replica is claiming
is skipped, not waited for —, updates them with a fresh token each and appends their events),
and a batch of creates is one ``INSERT ... SELECT`` with its events and its ``NOTIFY``. SQLite
runs the same decisions step by step on its thread, where a step costs no round trip.
"""

from __future__ import annotations

import json
from abc import abstractmethod
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol

from gpugate.core import job_transitions as transitions
from gpugate.core.job_states import JOB_STATES, JobEvent, JobRecord, check_runtime
from gpugate.errors import BadRequest, StoreError
from gpugate.store.base import check_limit
from gpugate.store.dialect import POSTGRES, Json, only_postgres, sql
from gpugate.store.jobs_writes import Created, Creation, JobWrites, LeasedWrite, fenced, written
from gpugate.store.ledger import COUNT_LEASED
from gpugate.store.tx import Driven, first, last, rows, run

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping, Sequence

    from gpugate.store.dialect import Query
    from gpugate.store.jobs_writes import Decide
    from gpugate.store.tx import Codec, Row, Tx

JOBS_CHANNEL = "gpugate_jobs"
"""The ``NOTIFY`` channel of new jobs (PostgreSQL; ``watch_jobs`` listens)."""
_MAX_ID = 2**63 - 1


def job_cursor(job_id: int) -> str:
    """The cursor of :meth:`JobStore.list_jobs` that continues after (older than) ``job_id``."""
    return str(job_id)


def parse_job_cursor(cursor: str) -> int:
    """The job id a cursor of :func:`job_cursor` holds; BadRequest for anything else."""
    if not (cursor.isascii() and cursor.isdigit() and int(cursor[:20]) <= _MAX_ID):
        raise BadRequest(f"invalid jobs cursor {cursor[:40]!r}")
    return int(cursor)


@dataclass(frozen=True, slots=True)
class JobPage:
    """One page of :meth:`JobStore.list_jobs`, newest first; ``next_cursor`` None on the last."""

    jobs: list[JobRecord]
    next_cursor: str | None


_JOB = ", ".join(transitions.JOB_COLUMNS)
_WRITTEN = tuple(name for name in transitions.JOB_FIELDS if name in transitions.WRITABLE_FIELDS)
_BY_SLUG = sql("SELECT {job} FROM jobs WHERE slug = :slug", job=_JOB)
_BY_KEY = sql("SELECT {job} FROM jobs WHERE idempotency_key = :key", job=_JOB)
_LOCK_ONE = sql("SELECT {job} FROM jobs WHERE slug = :slug FOR UPDATE", job=_JOB)
_LOCK = sql(
    "SELECT {job} FROM jobs WHERE slug IN (SELECT value FROM json_each(:slugs)) ORDER BY id",
    # = ANY of an array built once: the unique index per slug (an IN (subquery) let the planner
    # hash-join a scan of the whole table).
    postgres="SELECT {job} FROM jobs WHERE slug = ANY(ARRAY(SELECT jsonb_array_elements_text("
    ":slugs))) ORDER BY id FOR UPDATE",
    job=_JOB,
)
_BY_KEYS = sql(
    "SELECT {job} FROM jobs WHERE idempotency_key IN (SELECT value FROM json_each(:keys))",
    postgres="SELECT {job} FROM jobs"
    " WHERE idempotency_key = ANY(ARRAY(SELECT jsonb_array_elements_text(:keys)))",
    job=_JOB,
)
_LIST = sql(
    """
SELECT {job} FROM jobs
WHERE (:state::text IS NULL OR state = :state) AND (:runner::text IS NULL OR runner = :runner)
  AND (:tenant::text IS NULL
       OR slug IN (SELECT id FROM tenancy WHERE kind = 'job' AND tenant = :tenant))
  AND (:before_id::bigint IS NULL OR id < :before_id)
ORDER BY id DESC LIMIT :limit""",
    job=_JOB,
)
_EXPIRED = sql(
    """
SELECT {job} FROM jobs
WHERE lease_expires_at IS NOT NULL AND lease_expires_at <= :now
  AND state IN ('dispatching', 'running')
ORDER BY lease_expires_at, id LIMIT :limit""",
    job=_JOB,
)
_QUEUED = sql("SELECT count(*) FROM jobs WHERE runner = :runner AND state = 'queued'")
_EVENTS = sql("""
SELECT e.id, j.slug, e.at, e.status, e.actor, e.runtime, e.call_id, e.error_code, e.detail
FROM job_events e JOIN jobs j ON j.id = e.job_id
WHERE j.slug = :slug
ORDER BY e.id""")
_CLAIM_PG = """
WITH picked AS (
    SELECT id FROM jobs
    WHERE state = 'queued' AND (not_before IS NULL OR not_before <= :due_by)
      AND (lease_expires_at IS NULL OR lease_expires_at <= :now) {only}
    ORDER BY id LIMIT :limit
    FOR UPDATE SKIP LOCKED
), numbered AS (
    SELECT id, row_number() OVER (ORDER BY id) AS n FROM picked
), claimed AS (
    UPDATE jobs
    SET state = 'dispatching', leased_by = jobs.slug || :holder, lease_kind = 'claim',
        lease_runtime = NULL, lease_call_id = NULL, lease_replica = :replica,
        lease_token = (:tokens::text[])[numbered.n], lease_expires_at = :expires_at,
        updated_at = :now
    FROM numbered
    WHERE jobs.id = numbered.id
    RETURNING {claimed}
), logged AS (
    INSERT INTO job_events (job_id, at, status, actor, runtime)
    SELECT id, :now, 'dispatching', 'dispatcher', runner FROM claimed
)
SELECT {job} FROM claimed ORDER BY id"""
_CLAIMABLE = """
SELECT {job} FROM jobs
WHERE state = 'queued' AND (not_before IS NULL OR not_before <= :due_by)
  AND (lease_expires_at IS NULL OR lease_expires_at <= :now) {only}
ORDER BY id LIMIT :limit"""
_CLAIMED = ", ".join(f"jobs.{column}" for column in transitions.JOB_COLUMNS)
_CLAIM = sql(_CLAIMABLE, postgres=_CLAIM_PG, job=_JOB, claimed=_CLAIMED, only="")
_CLAIM_ONE = sql(
    _CLAIMABLE, postgres=_CLAIM_PG, job=_JOB, claimed=_CLAIMED, only="AND slug = :slug"
)
_INSERT_JOB = sql(
    # SQLite: the batch as one JSON document of rows (one json.dumps in C; a statement per job
    # cost a hop of the GIL and a dict of Python values each), inserted in its order.
    """
INSERT INTO jobs (slug, idempotency_key, model, class, operation, input, input_ref, runner, state,
                  not_before, allow_external, created_at, updated_at)
SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]'), json_extract(value, '$[2]'),
       json_extract(value, '$[3]'), json_extract(value, '$[4]'), json_extract(value, '$[5]'),
       json_extract(value, '$[6]'), json_extract(value, '$[7]'), 'queued',
       json_extract(value, '$[8]'), json_extract(value, '$[9]'), json_extract(value, '$[10]'),
       json_extract(value, '$[10]')
FROM json_each(:rows) WHERE true ORDER BY key
ON CONFLICT DO NOTHING
RETURNING {job}""",
    postgres="""
WITH wanted AS (
    SELECT * FROM ROWS FROM (jsonb_to_recordset(:rows::jsonb)
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
    RETURNING {job}
), logged AS (
    INSERT INTO job_events (job_id, at, status, actor, runtime, detail)
    SELECT id, created_at, 'queued', 'api', runner, '{}'::jsonb FROM created
)
SELECT {job}, pg_notify('gpugate_jobs', slug) FROM created""",
    job=_JOB,
)
_EVENT_COLUMNS = ", ".join(transitions.EVENT_COLUMNS)
_WRITE = only_postgres(
    """
WITH changed AS (
    UPDATE jobs SET runner = v.runner, state = v.state, attempts = v.attempts,
        submit_count = v.submit_count, rescue_count = v.rescue_count, leased_by = v.leased_by,
        lease_kind = v.lease_kind, lease_runtime = v.lease_runtime,
        lease_call_id = v.lease_call_id, lease_replica = v.lease_replica,
        lease_token = v.lease_token, lease_expires_at = v.lease_expires_at,
        not_before = v.not_before, result = v.result, result_ref = v.result_ref,
        error_code = v.error_code, error_message = v.error_message, cost_cents = v.cost_cents,
        updated_at = v.updated_at, finished_at = v.finished_at
    FROM jsonb_to_recordset(:rows::jsonb) AS v(id bigint, runner text, state text,
        attempts jsonb, submit_count integer, rescue_count integer, leased_by text,
        lease_kind text, lease_runtime text, lease_call_id text, lease_replica text,
        lease_token text, lease_expires_at timestamptz, not_before timestamptz, result jsonb,
        result_ref text, error_code text, error_message text, cost_cents float8,
        updated_at timestamptz, finished_at timestamptz)
    WHERE jobs.id = v.id
)
INSERT INTO job_events ({events})
SELECT {events} FROM ROWS FROM (jsonb_to_recordset(:events::jsonb) AS (job_id bigint,
    at timestamptz, status text, actor text, runtime text, call_id text, error_code text,
    detail jsonb)) WITH ORDINALITY AS e({events}, n)
ORDER BY n""",
    events=_EVENT_COLUMNS,
)
_INSERT_EVENT = sql(
    # SQLite: a batch's events as one JSON document of rows, as the creates.
    """
INSERT INTO job_events ({events})
SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]'), json_extract(value, '$[2]'),
       json_extract(value, '$[3]'), json_extract(value, '$[4]'), json_extract(value, '$[5]'),
       json_extract(value, '$[6]'), json_extract(value, '$[7]')
FROM json_each(:events) ORDER BY key""",
    postgres=None,
    events=_EVENT_COLUMNS,
)


def _doc(value: Any) -> str:
    """Rows as one JSON document; StoreError for a value JSON cannot hold (as psycopg's own
    Jsonb would), which the group commit then pins on the write at fault."""
    try:
        return json.dumps(value, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise StoreError(f"a job write holds a value JSON cannot hold: {exc}") from exc


def _iso(value: Any) -> Any:
    return value.isoformat() if isinstance(value, datetime) else value


def _decoders(c: Codec) -> tuple[tuple[int, Callable[[Any], Any]], ...]:
    """The fields a row holds in the backend's encoding, by index, and how to read each."""

    def pick(name: str) -> Callable[[Any], Any] | None:
        if name in transitions.JSON_FIELDS:
            return c.json
        if name in transitions.TIME_FIELDS:
            return c.time
        return {"allow_external": bool, "cost_cents": float}.get(name)

    picked = ((n, pick(name)) for n, name in enumerate(transitions.JOB_FIELDS))
    return tuple((n, decode) for n, decode in picked if decode is not None)


_DECODERS: dict[str, tuple[tuple[int, Callable[[Any], Any]], ...]] = {}


def job_of(c: Codec, row: Row) -> JobRecord:
    """A :class:`JobRecord` from a row of the job columns."""
    decoders = _DECODERS.get(c.dialect) or _DECODERS.setdefault(c.dialect, _decoders(c))
    values = list(row)
    for n, decode in decoders:
        if values[n] is not None:
            values[n] = decode(values[n])
    return JobRecord(*values)


def _event_row(c: Codec, job_id: int, at: datetime, event: transitions.EventDraft) -> Any:
    """An event to store: a list in the order of :data:`EVENT_COLUMNS
    <gpugate.core.job_transitions.EVENT_COLUMNS>` for SQLite's ``json_each`` (a time as the
    driver writes one), by those names for PostgreSQL's ``jsonb_to_recordset``."""
    e = event
    row = [job_id, at, e.status, e.actor, e.runtime, e.call_id, e.error_code, e.detail]
    if c.dialect == POSTGRES:
        row[1] = at.isoformat()
        return dict(zip(transitions.EVENT_COLUMNS, row, strict=True))
    return row


def _job_row(c: Codec, job: JobRecord, names: Iterable[str]) -> dict[str, Any]:
    if c.dialect == POSTGRES:
        return {"id": job.id} | {name: _iso(getattr(job, name)) for name in _WRITTEN}
    values: dict[str, Any] = {"id": job.id}
    for name in names:
        value = getattr(job, name)
        json_field = value is not None and name in transitions.JSON_FIELDS
        values[name] = Json(value) if json_field else value
    return values


_UPDATES: dict[frozenset[str], Query] = {}


def _update(names: frozenset[str]) -> Query:
    """SQLite's UPDATE of these columns (of the writable ones: a checked fragment), once each.

    Only the columns a change set: SQLite rewrites the index entries of every column it sets.
    """
    query = _UPDATES.get(names)
    if query is None:
        sets = ", ".join(f"{name} = :{name}" for name in _WRITTEN if name in names)
        query = _UPDATES[names] = sql("UPDATE jobs SET {sets} WHERE id = :id", sets=sets)
    return query


def _write(
    c: Codec, jobs: Mapping[str, tuple[JobRecord, set[str]]], events: Sequence[Any]
) -> Tx[None]:
    """Each job's final row (by slug, with the columns its changes set) and the events, as one
    step (SQLite: one UPDATE per job, of the columns set, on its thread)."""
    if not jobs:
        return
    if c.dialect == POSTGRES:
        written_rows = [_job_row(c, job, ()) for job, _ in jobs.values()]
        yield from last(_WRITE, {"rows": _doc(written_rows), "events": _doc(events)})
        return
    shapes: dict[frozenset[str], list[dict[str, Any]]] = {}
    for job, columns in jobs.values():
        shapes.setdefault(frozenset(columns), []).append(_job_row(c, job, columns))
    for shape, params in shapes.items():
        yield from run(_update(shape), params)
    if events:
        yield from run(_INSERT_EVENT, {"events": Json(events)})


def _change_many(c: Codec, writes: Sequence[LeasedWrite]) -> Tx[list[JobRecord | Exception | None]]:
    slugs = list(dict.fromkeys(write.slug for write in writes))
    jobs = {
        job.slug: job
        for job in (job_of(c, r) for r in (yield from rows(_LOCK, {"slugs": Json(slugs)})))
    }
    outcomes: list[JobRecord | Exception | None] = []
    changed: dict[str, tuple[JobRecord, set[str]]] = {}
    events: list[Any] = []
    for write in writes:
        job = jobs.get(write.slug)
        if job is None or not fenced(job, write.token):
            outcomes.append(None)
            continue
        try:
            change = write.decide(job)
            appended = [_event_row(c, job.id, write.now, event) for event in change.events]
        except Exception as exc:  # noqa: BLE001 - this write's own failure is its answer
            outcomes.append(exc)
            continue
        if change.values:
            job = jobs[write.slug] = written(job, change)
            names = changed[write.slug][1] if write.slug in changed else set()
            changed[write.slug] = job, names | set(change.values)
        events += appended
        outcomes.append(job)
    yield from _write(c, changed, events)
    return outcomes


def _change_one(c: Codec, slug: str, now: datetime, decide: Decide) -> Tx[JobRecord | None]:
    row = yield from first(_LOCK_ONE, {"slug": slug})
    if row is None:
        return None
    job = job_of(c, row)
    change = decide(job)
    if not change.values:
        return job
    done = written(job, change)
    events = [_event_row(c, job.id, now, event) for event in change.events]
    yield from _write(c, {slug: (done, set(change.values))}, events)
    return done


def _claim(c: Codec, query: Any, params: dict[str, Any], lease_s: float) -> Tx[list[JobRecord]]:
    found = [job_of(c, row) for row in (yield from rows(query, params))]
    if c.dialect == POSTGRES:
        return found  # the statement claimed them
    now, replica = params["now"], params["replica"]
    claimed: dict[str, tuple[JobRecord, set[str]]] = {}
    events = []
    for job, token in zip(found, params["tokens"], strict=False):
        change = transitions.claim(job, now=now, lease_s=lease_s, token=token, replica=replica)
        claimed[job.slug] = written(job, change), set(change.values)
        assert change.event is not None
        events.append(_event_row(c, job.id, now, change.event))
    yield from _write(c, claimed, events)
    return [job for job, _ in claimed.values()]


_NEW_COLUMNS = (
    "slug", "idempotency_key", "model", "class", "operation", "input", "input_ref", "runner",
    "not_before", "allow_external", "at",
)  # fmt: skip
"""A new job's values in the order of :data:`_INSERT_JOB`'s ``$[n]`` (SQLite) and names
(PostgreSQL)."""


def _new_row(creation: Creation) -> list[Any]:
    """A new job's values in the order of :data:`_NEW_COLUMNS`."""
    n, new = creation, creation.new
    return [n.slug, new.idempotency_key, new.model, new.job_class, new.operation, new.input,
            new.input_ref, new.runner, new.not_before, new.allow_external, n.now]  # fmt: skip


def _create(c: Codec, creations: Sequence[Creation]) -> Tx[list[Created | Exception]]:
    new_rows = [_new_row(creation) for creation in creations]
    if c.dialect == POSTGRES:  # by name, times as text; the last column is pg_notify's
        named = [dict(zip(_NEW_COLUMNS, row, strict=True)) for row in new_rows]
        for row in named:
            row["not_before"], row["at"] = _iso(row["not_before"]), _iso(row["at"])
        added = [
            job_of(c, row[:-1]) for row in (yield from rows(_INSERT_JOB, {"rows": _doc(named)}))
        ]
    else:  # lists, times as SQLite's (the driver's JSON encoder)
        added = [job_of(c, row) for row in (yield from rows(_INSERT_JOB, {"rows": Json(new_rows)}))]
        events = [
            _event_row(c, job.id, job.created_at, transitions.created_event(job.runner))
            for job in sorted(added, key=lambda job: job.id)
        ]
        if events:
            yield from run(_INSERT_EVENT, {"events": Json(events)})
    inserted = {job.slug: job for job in added}
    keys = [n.new.idempotency_key for n in creations if n.new.idempotency_key is not None]
    existing: dict[str | None, JobRecord] = {}
    if len(inserted) < len(creations) and keys:
        found = yield from rows(_BY_KEYS, {"keys": Json(keys)})
        existing = {job.idempotency_key: job for job in (job_of(c, row) for row in found)}
    return _creations(creations, inserted, existing)


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


class JobStore(JobWrites, Driven, Protocol):
    """The durable jobs: creation, claims, fenced lease-holder writes, operator verbs, reaping.

    Every method is atomic (creates and fenced writes in flight at the same moment may share one
    transaction — group commit — but each succeeds, is refused or fails on its own) and takes
    its time from the store's clock. Lifecycle: :meth:`create_job` (``queued``) ->
    :meth:`claim_jobs` or :meth:`claim_job` (``dispatching``, a fresh lease and token) ->
    :meth:`promote_runner`, :meth:`record_submit`, :meth:`record_attempt_failure` ->
    :meth:`mark_running` (or ``record_submit(running=True)``) -> :meth:`complete` |
    :meth:`fail`; :meth:`release` puts a job back in the queue, :meth:`rescue` takes back a
    lost lease.

    **Fencing.** Every method that takes ``token`` changes nothing and answers False / None
    unless the job is ``dispatching`` or ``running`` and its current ``lease_token`` equals
    ``token``. A token stays the same for the whole lease (the dispatcher's claim, the submit,
    the runtime's call) and dies when the job is released, rescued, finished or cancelled, so a
    late writer holding an old token changes nothing. An expired lease that nobody took back
    yet is still honoured: only :meth:`rescue` ends it.
    """

    async def _create_many(self, creations: Sequence[Creation]) -> list[Created | Exception]:
        # PostgreSQL: one statement each (the insert, then a read of the keys held): no BEGIN.
        return await self._transact(_create(self._codec, creations), single=True)

    async def _change_leased_many(
        self, writes: Sequence[LeasedWrite]
    ) -> list[JobRecord | Exception | None]:
        return await self._transact(_change_many(self._codec, writes))

    async def _change_job(self, slug: str, now: datetime, decide: Decide) -> JobRecord | None:
        return await self._transact(_change_one(self._codec, slug, now, decide))

    async def _job(self, query: Any, params: dict[str, Any]) -> JobRecord | None:
        row = await self._query(first(query, params))
        return None if row is None else job_of(self._codec, row)

    async def _jobs(self, query: Any, params: dict[str, Any]) -> list[JobRecord]:
        return [job_of(self._codec, row) for row in await self._query(rows(query, params))]

    async def get_job(self, slug: str) -> JobRecord | None:
        """The job, None when no job has this slug."""
        return await self._job(_BY_SLUG, {"slug": slug})

    async def job_by_idempotency_key(self, key: str) -> JobRecord | None:
        """The job created with ``key``, None when there is none."""
        return await self._job(_BY_KEY, {"key": key})

    async def job_events(self, slug: str) -> list[JobEvent]:
        """The job's events, oldest first; empty for an unknown slug."""
        c = self._codec
        return [
            JobEvent(id_, slug_, c.time(at), status, actor, runtime, call, code, c.json(detail))
            for id_, slug_, at, status, actor, runtime, call, code, detail in await self._query(
                rows(_EVENTS, {"slug": slug})
            )
        ]

    async def list_jobs(
        self,
        *,
        state: str | None = None,
        runner: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
        tenant: str | None = None,
    ) -> JobPage:
        """Jobs newest first (by id), optionally of one state and/or runner (and of one
        ``tenant``: the jobs it owns, :meth:`KeyStore.own`).

        ``cursor`` is the ``next_cursor`` of the previous page (opaque); a malformed one raises
        BadRequest, an unknown ``state`` or a ``limit`` below 1 ValueError.
        """
        if state is not None and state not in JOB_STATES:
            raise ValueError(f"unknown job state {state!r}: expected one of {JOB_STATES}")
        params = {"state": state, "runner": runner, "limit": check_limit(limit) + 1}
        params["before_id"] = None if cursor is None else parse_job_cursor(cursor)
        jobs = await self._jobs(_LIST, params | {"tenant": tenant})
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
        """Lease up to ``limit`` claimable jobs to the dispatcher, oldest (lowest id) first.

        Claimable: ``queued``, ``not_before`` null or reached by ``due_by``, no live lease. Each
        claimed job becomes ``dispatching`` with ``leased_by = "<slug>-dispatcher@<replica>"``,
        a fresh ``lease_token`` and ``lease_expires_at = now + lease_s`` (event
        ``dispatching`` at ``now``). Concurrent claimers (other replicas included) never get the
        same job; a claimer may get fewer than ``limit`` while others hold rows. ``now``
        defaults to the store's clock, ``due_by`` to ``now``: a claimer that looks ahead (a
        slot freed, so jobs waiting for one are due early) still stamps the claim with the time
        it happened.
        """
        at = self._clock.now() if now is None else now
        params = {"due_by": at if due_by is None else due_by}
        return await self._claim(_CLAIM, at, check_limit(limit), lease_s, params)

    async def claim_job(self, slug: str, *, lease_s: float) -> JobRecord | None:
        """:meth:`claim_jobs` for one job (the event-driven path); None unless claimable now."""
        now = self._clock.now()
        claimed = await self._claim(_CLAIM_ONE, now, 1, lease_s, {"slug": slug, "due_by": now})
        return claimed[0] if claimed else None

    async def _claim(
        self, query: Any, now: datetime, limit: int, lease_s: float, extra: dict[str, Any]
    ) -> list[JobRecord]:
        transitions.check_lease_s(lease_s)
        params = extra | {"now": now, "limit": limit, "holder": self._holder}
        params["replica"] = self._replica
        params["tokens"] = transitions.new_lease_tokens(limit)
        params["expires_at"] = now + timedelta(seconds=lease_s)
        return await self._transact(_claim(self._codec, query, params, lease_s), single=True)

    async def expired_leases(
        self, *, now: datetime | None = None, limit: int = 100
    ) -> list[JobRecord]:
        """``dispatching``/``running`` jobs whose lease expired (``lease_expires_at <= now``),
        the longest expired first, tokens included so that :meth:`rescue` can be fenced.
        """
        at = self._clock.now() if now is None else now
        return await self._jobs(_EXPIRED, {"now": at, "limit": check_limit(limit)})

    async def count_leased(self, runtime: str) -> int:
        """Calls of ``runtime`` in flight: ``dispatching``/``running`` jobs whose ``leased_by``
        is ``<runtime>:...`` (all replicas; what ``max_concurrency`` limits).
        """
        check_runtime(runtime)
        return int((await self._query(rows(COUNT_LEASED, {"runtime": runtime})))[0][0])

    async def queue_depth(self, runtime: str) -> int:
        """``queued`` jobs whose runner is ``runtime``."""
        return int((await self._query(rows(_QUEUED, {"runner": runtime})))[0][0])

    @abstractmethod
    async def watch_jobs(self, on_job: Callable[[str], None]) -> None:
        """Call ``on_job(slug)`` whenever a process creates a job, until
        cancelled (PostgreSQL: LISTEN/NOTIFY, so every replica wakes at once). Returns at once
        where one process owns the store (SQLite): the dispatcher is woken in-process."""
