"""The PostgreSQL store: many gateway replicas on one database, through a small connection pool.

Every method is one transaction on a pooled connection. Races between replicas are settled by the
database: config numbering under a table lock, idempotency keys by ``INSERT ... ON CONFLICT``,
migrations under a transaction-scoped advisory lock (one per schema, so isolated schemas on one
server do not wait for each other). JSON is jsonb, response bodies bytea, times timestamptz.
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from gpugate.config.fields import redact_store_url as redact_dsn
from gpugate.errors import MigrationError, StoreError, StoreUnavailable
from gpugate.store.base import (
    CONFIG_SAVED,
    CONFIG_SEEDED,
    CONFIG_SUBJECT,
    AuditEvent,
    AuditRecord,
    ConfigVersion,
    IdemBegin,
    IdemRecord,
    Started,
    check_limit,
    idem_verdict,
)
from gpugate.store.migrations import Migration, load_migrations, pending
from gpugate.store.postgres_audit import audit_query, audit_record, insert_audit
from gpugate.store.postgres_facade import PostgresFacade
from gpugate.store.postgres_jobs import JOBS_CHANNEL, PostgresJobs
from gpugate.store.postgres_keys import PostgresKeys
from gpugate.store.postgres_ledger import PostgresLedger
from gpugate.store.postgres_replicas import PostgresReplicas
from gpugate.store.postgres_retention import PostgresRetention
from gpugate.store.postgres_runtime_state import PostgresRuntimeState
from gpugate.store.replicas import replica_id

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Sequence

    from psycopg.rows import TupleRow

    from gpugate.clock import Clock

    Connection = psycopg.AsyncConnection[TupleRow]

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
_HAS_SCHEMA_MIGRATIONS = "SELECT to_regclass('schema_migrations') IS NOT NULL"
_SCHEMA_VERSION = "SELECT coalesce(max(version), 0) FROM schema_migrations"

_LOCK_CONFIG = "LOCK TABLE config_versions IN EXCLUSIVE MODE"
_CONFIG_COLUMNS = "version, document, created_at, actor, note"
_SELECT_CONFIG = f"SELECT {_CONFIG_COLUMNS} FROM config_versions"  # noqa: S608 -- constants only
_SAVE_CONFIG = f"""
INSERT INTO config_versions (version, document, created_at, actor, note)
SELECT coalesce(max(version), 0) + 1, %(document)s, %(now)s, %(actor)s, %(note)s
FROM config_versions
RETURNING {_CONFIG_COLUMNS}"""  # noqa: S608 -- constants only; values are bound
_SEED_CONFIG = """
INSERT INTO config_versions (version, document, created_at, actor, note)
VALUES (1, %(document)s, %(now)s, %(actor)s, 'seeded')
RETURNING version, document, created_at, actor, note"""

_IDEM_BEGIN = """
INSERT INTO idempotency AS held (key, fingerprint, state, created_at, expires_at, owner)
VALUES (%(key)s, %(fingerprint)s, 'in_flight', %(now)s, %(expires_at)s, %(owner)s)
ON CONFLICT (key) DO UPDATE SET
    fingerprint = excluded.fingerprint, state = 'in_flight', status = NULL, headers = NULL,
    body = NULL, created_at = excluded.created_at, expires_at = excluded.expires_at,
    owner = excluded.owner
WHERE held.expires_at <= excluded.created_at
RETURNING key"""
_IDEM_HELD = """
SELECT key, fingerprint, state, status, headers, body, created_at, expires_at
FROM idempotency WHERE key = %(key)s"""
_IDEM_COMPLETE = """
UPDATE idempotency
SET state = 'completed', status = %(status)s, headers = %(headers)s, body = %(body)s,
    expires_at = coalesce(%(expires_at)s, expires_at)
WHERE key = %(key)s AND owner = %(owner)s AND state = 'in_flight' AND expires_at > %(now)s"""
_IDEM_ABANDON = """
DELETE FROM idempotency
WHERE key = %(key)s AND owner = %(owner)s AND state = 'in_flight' AND expires_at > %(now)s"""
_IDEM_PURGE = "DELETE FROM idempotency WHERE expires_at <= %(now)s"

log = logging.getLogger("gpugate.store")


class PostgresStore(
    PostgresJobs,
    PostgresRuntimeState,
    PostgresFacade,
    PostgresReplicas,
    PostgresLedger,
    PostgresRetention,
    PostgresKeys,
):
    """The shared store: PostgreSQL through a psycopg connection pool.

    The job methods come from :class:`PostgresJobs`, the runtime states from
    :class:`PostgresRuntimeState`, on the same pool.
    """

    backend = "postgresql"

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

    def __repr__(self) -> str:
        schema = "?" if self._schema is None else str(self._schema)
        closed = "" if self._pool is not None else " closed"
        return f"<PostgresStore dsn={self._shown} schema={schema}{closed}>"

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
        migrations = load_migrations("postgres")
        now = self._clock.now()
        async with self._transaction() as conn:
            await conn.execute(_LOCK_MIGRATIONS)
            await conn.execute(_CREATE_SCHEMA_MIGRATIONS)
            cursor = await conn.execute("SELECT version FROM schema_migrations")
            applied = {row[0] for row in await cursor.fetchall()}
            names = [
                await _apply(conn, migration, now) for migration in pending(migrations, applied)
            ]
            self._schema = await _schema_version(conn)
        return names

    async def schema_version(self) -> int:
        async with self._transaction() as conn:
            self._schema = await _schema_version(conn)
        return self._schema

    async def current_config(self) -> ConfigVersion | None:
        async with self._transaction() as conn:
            return await _current_config(conn)

    async def get_config(self, version: int) -> ConfigVersion | None:
        async with self._transaction() as conn:
            cursor = await conn.execute(
                f"{_SELECT_CONFIG} WHERE version = %(version)s", {"version": version}
            )
            row = await cursor.fetchone()
        return None if row is None else _config(row)

    async def list_configs(self, limit: int = 50) -> list[ConfigVersion]:
        sql = f"{_SELECT_CONFIG} ORDER BY version DESC LIMIT %(limit)s"
        async with self._transaction() as conn:
            cursor = await conn.execute(sql, {"limit": check_limit(limit)})
            return [_config(row) for row in await cursor.fetchall()]

    async def save_config(
        self, document: dict[str, Any], *, actor: str, note: str
    ) -> ConfigVersion:
        now = self._clock.now()
        params = {"document": Jsonb(document), "now": now, "actor": actor, "note": note}
        async with self._transaction() as conn:
            await conn.execute(_LOCK_CONFIG)
            saved = _config(await _one(await conn.execute(_SAVE_CONFIG, params)))
            detail = {"version": saved.version, "note": note}
            await insert_audit(conn, now, AuditEvent(actor, CONFIG_SAVED, CONFIG_SUBJECT, detail))
        return saved

    async def seed_config(
        self, document: dict[str, Any], *, actor: str
    ) -> tuple[ConfigVersion, bool]:
        now = self._clock.now()
        params = {"document": Jsonb(document), "now": now, "actor": actor}
        async with self._transaction() as conn:
            await conn.execute(_LOCK_CONFIG)
            current = await _current_config(conn)
            if current is not None:
                return current, False
            seeded = _config(await _one(await conn.execute(_SEED_CONFIG, params)))
            event = AuditEvent(actor, CONFIG_SEEDED, CONFIG_SUBJECT, {"version": seeded.version})
            await insert_audit(conn, now, event)
        return seeded, True

    async def append_audit(self, event: AuditEvent) -> AuditRecord:
        async with self._transaction() as conn:
            return await insert_audit(conn, self._clock.now(), event)

    async def list_audit(
        self,
        *,
        action: str | None = None,
        subject: str | None = None,
        limit: int = 100,
        before_id: int | None = None,
        actor: str | None = None,
        since: datetime | None = None,
    ) -> list[AuditRecord]:
        filters: dict[str, object] = {"action": action, "subject": subject, "actor": actor}
        filters |= {"since": since, "before_id": before_id}
        sql, params = audit_query(filters, check_limit(limit))
        async with self._transaction() as conn:
            cursor = await conn.execute(sql, params)
            return [audit_record(row) for row in await cursor.fetchall()]

    async def idem_begin(
        self, key: str, fingerprint: str, *, ttl_s: float, owner: str
    ) -> IdemBegin:
        now = self._clock.now()
        params = {"key": key, "fingerprint": fingerprint, "owner": owner, "now": now}
        params["expires_at"] = now + timedelta(seconds=ttl_s)
        async with self._transaction() as conn:
            cursor = await conn.execute(_IDEM_BEGIN, params)
            if await cursor.fetchone() is not None:
                return Started()
            # The conflicting row is locked by the upsert above, so it is still there.
            row = await _one(await conn.execute(_IDEM_HELD, params))
        completed = _idem_record(row) if row[2] == "completed" else None
        return idem_verdict(fingerprint, row[1], completed)

    async def idem_complete(
        self,
        key: str,
        owner: str,
        status: int,
        headers: Sequence[tuple[str, str]],
        body: bytes,
        *,
        ttl_s: float | None = None,
    ) -> bool:
        now = self._clock.now()
        expires_at = None if ttl_s is None else now + timedelta(seconds=ttl_s)
        params = {"key": key, "owner": owner, "status": status, "body": body, "now": now}
        params |= {"headers": Jsonb([list(pair) for pair in headers]), "expires_at": expires_at}
        async with self._transaction() as conn:
            cursor = await conn.execute(_IDEM_COMPLETE, params)
            return cursor.rowcount == 1

    async def idem_abandon(self, key: str, owner: str) -> bool:
        params = {"key": key, "owner": owner, "now": self._clock.now()}
        async with self._transaction() as conn:
            cursor = await conn.execute(_IDEM_ABANDON, params)
            return cursor.rowcount == 1

    async def idem_purge_expired(self) -> int:
        async with self._transaction() as conn:
            cursor = await conn.execute(_IDEM_PURGE, {"now": self._clock.now()})
            return cursor.rowcount

    # --- connections ---------------------------------------------------------------------------

    async def _probe(self) -> int:
        """Connect once outside the pool: fails fast, with libpq's own reason."""
        timeout = max(2, round(self._connect_timeout_s))
        async with await psycopg.AsyncConnection.connect(
            self._dsn, connect_timeout=timeout
        ) as conn:
            return await _schema_version(conn)

    @asynccontextmanager
    async def _transaction(self, *, single: bool = False) -> AsyncIterator[Connection]:
        """A pooled connection in a transaction; the one place psycopg's exceptions become ours.

        ``single``: for one statement, which is atomic on its own: no ``BEGIN`` and ``COMMIT``,
        two round trips saved (the pool's connections are in autocommit mode).
        """
        pool = self._pool
        if pool is None:
            raise StoreUnavailable(f"the PostgreSQL store {self._shown} is not open")
        try:
            async with pool.connection() as conn:
                if single:
                    yield conn
                    return
                async with conn.transaction():
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


async def _schema_version(conn: Connection) -> int:
    (exists,) = await _one(await conn.execute(_HAS_SCHEMA_MIGRATIONS))
    if not exists:
        return 0
    return int((await _one(await conn.execute(_SCHEMA_VERSION)))[0])


async def _current_config(conn: Connection) -> ConfigVersion | None:
    cursor = await conn.execute(f"{_SELECT_CONFIG} ORDER BY version DESC LIMIT 1")
    row = await cursor.fetchone()
    return None if row is None else _config(row)


async def _one(cursor: psycopg.AsyncCursor[TupleRow]) -> TupleRow:
    row = await cursor.fetchone()
    if row is None:
        raise StoreError("the statement returned no row")
    return row


def _config(row: TupleRow) -> ConfigVersion:
    version, document, created_at, actor, note = row
    return ConfigVersion(version, document, _utc(created_at), actor, note)


def _idem_record(row: TupleRow) -> IdemRecord:
    key, fingerprint, _state, status, headers, body, created_at, expires_at = row
    pairs = tuple((str(name), str(value)) for name, value in headers)
    return IdemRecord(
        key, fingerprint, status, pairs, bytes(body), _utc(created_at), _utc(expires_at)
    )


def _utc(moment: datetime) -> datetime:
    return moment.astimezone(UTC)


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__
