"""The PostgreSQL store: many gateway replicas on one database, through a small connection pool.

Every method is one transaction on a pooled connection, run in pipeline mode: ``BEGIN`` goes
with the transaction's first statement and ``COMMIT`` with its last write (:func:`tx.last`),
so a fenced write — lock and read the jobs, decide, write — is two round trips, not four, and
its ``COMMIT`` leaves as soon as the decision is made. Two batches of fenced writes run at once,
so a completion does not wait for an unrelated batch to commit (the at-least-once window on
PostgreSQL is how long an answer waits for its ``COMMIT``: ``docs/jobs.md``).

Races between replicas are settled by the database: config numbering under a table lock,
idempotency keys by ``INSERT ... ON CONFLICT``, migrations under a transaction-scoped advisory
lock (one per schema, so isolated schemas on one server do not wait for each other). JSON is
jsonb, response bodies bytea, times timestamptz.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, TypeVar, cast

import psycopg
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from gpugate.config.fields import redact_store_url as redact_dsn
from gpugate.errors import MigrationError, StoreError, StoreUnavailable
from gpugate.store.dialect import Json
from gpugate.store.jobs_sql import JOBS_CHANNEL
from gpugate.store.migrations import Migration, load_migrations, pending, schema_version
from gpugate.store.replicas import replica_id
from gpugate.store.sql_store import Store
from gpugate.store.tx import POSTGRES_CODEC, SKIPPED, Codec, Last, Result, Rollback

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Sequence
    from datetime import datetime

    from psycopg.rows import TupleRow

    from gpugate.clock import Clock
    from gpugate.store.dialect import Query
    from gpugate.store.tx import Tx

    Connection = psycopg.AsyncConnection[TupleRow]

T = TypeVar("T")

_LOCK_MIGRATIONS = (
    "SELECT pg_advisory_xact_lock(hashtext('gpugate.migrate/' || coalesce(current_schema(), '')))"
)
_CREATE_SCHEMA_MIGRATIONS = """
CREATE TABLE IF NOT EXISTS schema_migrations (
    version    integer PRIMARY KEY,
    name       text NOT NULL,
    applied_at timestamptz NOT NULL
)"""
_RECORD_MIGRATION = """
INSERT INTO schema_migrations (version, name, applied_at) VALUES (%(version)s, %(name)s, %(now)s)
"""

log = logging.getLogger("gpugate.store")
_OPEN = frozenset({psycopg.pq.TransactionStatus.INTRANS, psycopg.pq.TransactionStatus.INERROR})


class PostgresStore(Store):
    """The shared store: PostgreSQL through a psycopg connection pool.

    Every method is written once (:class:`Store`); this is its driver: each transaction runs
    on a pooled connection, each step awaited (:mod:`gpugate.store.tx`).
    """

    backend = "postgresql"
    _codec: Codec = POSTGRES_CODEC
    _leased_overlap = 2  # a fenced batch in flight does not hold the next one back

    def __init__(
        self,
        dsn: str,
        *,
        clock: Clock,
        min_size: int = 1,
        max_size: int = 10,
        connect_timeout_s: float = 5.0,
    ) -> None:
        self._dsn = dsn
        self._shown = redact_dsn(dsn)
        self._clock = clock
        self._replica = replica_id()
        self._min_size = min_size
        self._max_size = max_size
        self._connect_timeout_s = connect_timeout_s
        self._pool: AsyncConnectionPool[Connection] | None = None
        self._schema: int | None = None

    def _describe(self) -> tuple[str, bool]:
        return f"dsn={self._shown}", self._pool is not None

    async def open(self) -> None:
        if self._pool is not None:
            return
        try:
            self._schema = await self._probe()
            pool: AsyncConnectionPool[Connection] = AsyncConnectionPool(
                self._dsn,
                min_size=self._min_size,
                max_size=self._max_size,
                open=False,
                timeout=self._connect_timeout_s,
                kwargs={"autocommit": True},  # transactions are explicit: _transaction()
                name="gpugate-store",
            )
            try:
                await pool.open(wait=True, timeout=self._connect_timeout_s)
            except BaseException:
                await pool.close()
                raise
        except psycopg.Error as exc:
            raise StoreUnavailable(
                f"cannot reach the PostgreSQL store at {self._shown}: {_first_line(exc)}"
            ) from exc
        self._pool = pool

    async def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()

    async def watch_jobs(self, on_job: Callable[[str], None]) -> None:
        """LISTEN for job creations on a connection of its own; reconnect after a failure
        (the dispatcher's sweep covers what a broken connection missed)."""
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(
                    self._dsn,
                    autocommit=True,
                    connect_timeout=max(2, round(self._connect_timeout_s)),
                ) as conn:
                    await conn.execute(f"LISTEN {JOBS_CHANNEL}")
                    async for notice in conn.notifies():
                        on_job(notice.payload)
            except psycopg.Error as exc:
                log.warning("job wake-ups from %s lost (%s); listening again", self._shown, exc)
                await asyncio.sleep(1.0)

    async def ping(self) -> None:
        async with self._transaction() as conn:
            await conn.execute("SELECT 1")

    async def migrate(self) -> list[str]:
        migrations = load_migrations(self._codec.dialect)
        now = self._clock.now()
        async with self._transaction() as conn:
            await conn.execute(_LOCK_MIGRATIONS)
            await conn.execute(_CREATE_SCHEMA_MIGRATIONS)
            cursor = await conn.execute("SELECT version FROM schema_migrations")
            applied = {row[0] for row in await cursor.fetchall()}
            names = [
                await _apply(conn, migration, now) for migration in pending(migrations, applied)
            ]
            self._schema = await _drive(conn, schema_version())
        return names

    async def schema_version(self) -> int:
        async with self._transaction() as conn:
            self._schema = await _drive(conn, schema_version())
        return self._schema

    # --- connections ---------------------------------------------------------------------------

    async def _probe(self) -> int:
        """Connect once outside the pool: fails fast, with libpq's own reason."""
        timeout = max(2, round(self._connect_timeout_s))
        async with await psycopg.AsyncConnection.connect(
            self._dsn, connect_timeout=timeout
        ) as conn:
            return await _drive(conn, schema_version())

    async def _transact(self, tx: Tx[T], *, single: bool = False) -> T:
        try:
            return await self._run(tx, single=single)
        except Rollback as rollback:
            return cast("T", rollback.value)

    async def _query(self, tx: Tx[T], *, single: bool = True) -> T:
        return await self._run(tx, single=single)

    async def _run(self, tx: Tx[T], *, single: bool) -> T:
        """``single``: one statement, atomic on its own: no ``BEGIN`` and ``COMMIT`` (the
        pool's connections are in autocommit mode); else a pipelined transaction."""
        async with self._connection() as conn:
            if single:
                return await _drive(conn, tx)
            try:
                return await _drive_pipelined(conn, tx)
            finally:
                if conn.info.transaction_status in _OPEN:  # the transaction broke off: undo it
                    await conn.execute("ROLLBACK")

    @asynccontextmanager
    async def _transaction(self) -> AsyncIterator[Connection]:
        """A pooled connection in a transaction (psycopg's, a round trip per statement)."""
        async with self._connection() as conn, conn.transaction():
            yield conn

    @asynccontextmanager
    async def _connection(self) -> AsyncIterator[Connection]:
        """A pooled connection; the one place psycopg's exceptions become ours."""
        pool = self._pool
        if pool is None:
            raise StoreUnavailable(f"the PostgreSQL store {self._shown} is not open")
        try:
            async with pool.connection() as conn:
                yield conn
        except psycopg.OperationalError as exc:
            raise StoreUnavailable(f"PostgreSQL store {self._shown}: {_first_line(exc)}") from exc
        except psycopg.Error as exc:
            raise StoreError(f"PostgreSQL store {self._shown}: {_first_line(exc)}") from exc


async def _apply(conn: Connection, migration: Migration, now: datetime) -> str:
    try:
        await conn.execute(migration.sql)
    except psycopg.Error as exc:
        raise MigrationError(
            f"migration postgres/{migration.name} failed: {_first_line(exc)}"
        ) from exc
    params = {"version": migration.version, "name": migration.name, "now": now}
    await conn.execute(_RECORD_MIGRATION, params)
    return migration.name


async def _drive(conn: Connection, tx: Tx[T]) -> T:
    """Run the transaction's steps on ``conn``, awaiting each."""
    try:
        step = next(tx)
        while True:
            step = tx.send(await _execute(conn, *step))
    except StopIteration as stop:
        return cast("T", stop.value)


async def _drive_pipelined(conn: Connection, tx: Tx[T]) -> T:
    """Run the transaction in pipeline mode, one round trip per step that is read: ``BEGIN``
    is sent with the first step, ``COMMIT`` with a :class:`Last` step (else after the last);
    leaving the pipeline syncs it, raising what the server refused."""
    async with conn.pipeline() as pipeline:
        await conn.execute("BEGIN")
        try:
            step = next(tx)
            while not isinstance(step[1], Last):
                step = tx.send(await _execute(conn, *step, pipeline=pipeline))
        except StopIteration as stop:
            await conn.execute("COMMIT")
            answer = cast("T", stop.value)
        else:
            await _send(conn, *step)
            await conn.execute("COMMIT")
            answer = _finished(tx)
    return answer


def _finished(tx: Tx[T]) -> T:
    """The answer of a transaction whose :class:`Last` step was sent (its result unread)."""
    try:
        tx.send(SKIPPED)
    except StopIteration as stop:
        return cast("T", stop.value)
    raise StoreError("a transaction went on after its last step")


async def _send(
    conn: Connection, query: Query, params: Mapping[str, Any] | Sequence[Mapping[str, Any]]
) -> psycopg.AsyncCursor[TupleRow] | None:
    """Send one step (``None`` when its dialect skips it); its results come at the next sync."""
    text = query.postgres
    if text is None:
        return None
    if isinstance(params, Mapping):
        return await conn.execute(text, {name: _encode(v) for name, v in params.items()})
    cursor = conn.cursor()
    await cursor.executemany(text, [{n: _encode(v) for n, v in p.items()} for p in params])
    return cursor


async def _execute(
    conn: Connection,
    query: Query,
    params: Mapping[str, Any] | Sequence[Mapping[str, Any]],
    *,
    pipeline: psycopg.AsyncPipeline | None = None,
) -> Result:
    """One step and its result (in a pipeline: sent with what is queued, then synced)."""
    cursor = await _send(conn, query, params)
    if cursor is None:
        return SKIPPED
    if pipeline is not None:
        await pipeline.sync()
    found = await cursor.fetchall() if cursor.description is not None else []
    return Result(found, cursor.rowcount)


def _encode(value: Any) -> Any:
    return Jsonb(value.value) if isinstance(value, Json) else value


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__
