"""The SQLite store: one file, one connection, owned by one dedicated thread.

Every public method is one hop to that thread, which runs the method's whole transaction (writes
under ``BEGIN IMMEDIATE``, so two processes on one file serialise instead of failing), and the
event loop never touches the connection. Timestamps are ISO-8601 UTC text of fixed width, so they
compare correctly as strings; JSON is stored as text.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

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
from gpugate.store.replicas import replica_id
from gpugate.store.sqlite_audit import audit_query, audit_record, insert_audit
from gpugate.store.sqlite_codec import json_text as _json
from gpugate.store.sqlite_codec import text_time as _dt
from gpugate.store.sqlite_codec import time_text as _ts
from gpugate.store.sqlite_facade import SqliteFacade
from gpugate.store.sqlite_jobs import SqliteJobs
from gpugate.store.sqlite_keys import SqliteKeys
from gpugate.store.sqlite_ledger import SqliteLedger
from gpugate.store.sqlite_replicas import SqliteReplicas
from gpugate.store.sqlite_retention import SqliteRetention
from gpugate.store.sqlite_runtime_state import SqliteRuntimeState

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence

    from gpugate.clock import Clock

T = TypeVar("T")

MEMORY = ":memory:"

# Result codes (primary, without the extended bits) that mean "cannot be reached or used now".
_UNAVAILABLE_CODES = frozenset(
    {
        sqlite3.SQLITE_BUSY,
        sqlite3.SQLITE_LOCKED,
        sqlite3.SQLITE_CANTOPEN,
        sqlite3.SQLITE_IOERR,
        sqlite3.SQLITE_NOTADB,
        sqlite3.SQLITE_PERM,
    }
)

_PRAGMAS = (
    "PRAGMA busy_timeout = 5000",
    "PRAGMA journal_mode = WAL",
    "PRAGMA synchronous = NORMAL",
    "PRAGMA foreign_keys = ON",
)

_CREATE_SCHEMA_MIGRATIONS = """
CREATE TABLE IF NOT EXISTS schema_migrations (
    version    INTEGER PRIMARY KEY,
    name       TEXT NOT NULL,
    applied_at TEXT NOT NULL
)"""

_CONFIG_COLUMNS = "version, document, created_at, actor, note"
_SELECT_CONFIG = f"SELECT {_CONFIG_COLUMNS} FROM config_versions"  # noqa: S608 -- constants only
_SAVE_CONFIG = f"""
INSERT INTO config_versions (version, document, created_at, actor, note)
SELECT coalesce(max(version), 0) + 1, :document, :now, :actor, :note FROM config_versions
RETURNING {_CONFIG_COLUMNS}"""  # noqa: S608 -- constants only; values are bound
_SEED_CONFIG = """
INSERT INTO config_versions (version, document, created_at, actor, note)
VALUES (1, :document, :now, :actor, 'seeded')
RETURNING version, document, created_at, actor, note"""

_IDEM_BEGIN = """
INSERT INTO idempotency (key, fingerprint, state, created_at, expires_at, owner)
VALUES (:key, :fingerprint, 'in_flight', :now, :expires_at, :owner)
ON CONFLICT (key) DO UPDATE SET
    fingerprint = excluded.fingerprint, state = 'in_flight', status = NULL, headers = NULL,
    body = NULL, created_at = excluded.created_at, expires_at = excluded.expires_at,
    owner = excluded.owner
WHERE idempotency.expires_at <= excluded.created_at
RETURNING key"""
_IDEM_HELD = """
SELECT key, fingerprint, state, status, headers, body, created_at, expires_at
FROM idempotency WHERE key = :key"""
_IDEM_COMPLETE = """
UPDATE idempotency
SET state = 'completed', status = :status, headers = :headers, body = :body,
    expires_at = coalesce(:expires_at, expires_at)
WHERE key = :key AND owner = :owner AND state = 'in_flight' AND expires_at > :now"""
_IDEM_ABANDON = """
DELETE FROM idempotency
WHERE key = :key AND owner = :owner AND state = 'in_flight' AND expires_at > :now"""
_IDEM_PURGE = "DELETE FROM idempotency WHERE expires_at <= :now"


class SqliteStore(
    SqliteJobs,
    SqliteRuntimeState,
    SqliteFacade,
    SqliteReplicas,
    SqliteLedger,
    SqliteRetention,
    SqliteKeys,
):
    """The embedded store: a SQLite file in WAL mode, reached through one worker thread.

    The job methods come from :class:`SqliteJobs`, the runtime states from
    :class:`SqliteRuntimeState`, the spend ledger from :class:`SqliteLedger`; they go through
    the same hop.
    """

    backend = "sqlite"

    def __init__(
        self, path: str, *, clock: Clock, trace: Callable[[str], None] | None = None
    ) -> None:
        """``trace``, when given, is called (on the store's thread) with every SQL statement."""
        self._path = path
        self._clock = clock
        self._replica = replica_id()
        self._trace = trace
        self._executor: ThreadPoolExecutor | None = None
        self._conn: sqlite3.Connection | None = None  # touched only on the store's thread
        self._schema: int | None = None

    @property
    def path(self) -> str:
        return self._path

    def __repr__(self) -> str:
        schema = "?" if self._schema is None else str(self._schema)
        closed = "" if self._executor is not None else " closed"
        return f"<SqliteStore path={self._path} schema={schema}{closed}>"

    async def open(self) -> None:
        if self._executor is not None:
            return
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gpugate-sqlite")
        try:
            self._schema = await self._submit(executor, self._connect)
        except BaseException:
            executor.shutdown(wait=False)
            raise
        self._executor = executor

    async def close(self) -> None:
        executor, self._executor = self._executor, None
        if executor is None:
            return
        try:
            await self._submit(executor, self._disconnect)
        finally:
            executor.shutdown(wait=False)

    async def watch_jobs(self, on_job: Callable[[str], None]) -> None:
        """One process owns a SQLite store: its dispatcher is woken in-process, nothing to do."""

    async def ping(self) -> None:
        await self._read(lambda conn: conn.execute("SELECT 1").fetchone())

    async def migrate(self) -> list[str]:
        work = partial(_apply_migrations, load_migrations("sqlite"), _ts(self._clock.now()))
        applied, self._schema = await self._write(work)
        return applied

    async def schema_version(self) -> int:
        self._schema = await self._read(_schema_version)
        return self._schema

    async def current_config(self) -> ConfigVersion | None:
        return await self._read(_current_config)

    async def get_config(self, version: int) -> ConfigVersion | None:
        def work(conn: sqlite3.Connection) -> ConfigVersion | None:
            row = conn.execute(f"{_SELECT_CONFIG} WHERE version = ?", (version,)).fetchone()
            return None if row is None else _config(row)

        return await self._read(work)

    async def list_configs(self, limit: int = 50) -> list[ConfigVersion]:
        sql = f"{_SELECT_CONFIG} ORDER BY version DESC LIMIT ?"

        def work(conn: sqlite3.Connection) -> list[ConfigVersion]:
            return [_config(row) for row in conn.execute(sql, (check_limit(limit),))]

        return await self._read(work)

    async def save_config(
        self, document: dict[str, Any], *, actor: str, note: str
    ) -> ConfigVersion:
        now = _ts(self._clock.now())
        params = {"document": _json(document), "now": now, "actor": actor, "note": note}

        def work(conn: sqlite3.Connection) -> ConfigVersion:
            saved = _config(conn.execute(_SAVE_CONFIG, params).fetchone())
            detail = {"version": saved.version, "note": note}
            insert_audit(conn, now, AuditEvent(actor, CONFIG_SAVED, CONFIG_SUBJECT, detail))
            return saved

        return await self._write(work)

    async def seed_config(
        self, document: dict[str, Any], *, actor: str
    ) -> tuple[ConfigVersion, bool]:
        now = _ts(self._clock.now())
        params = {"document": _json(document), "now": now, "actor": actor}

        def work(conn: sqlite3.Connection) -> tuple[ConfigVersion, bool]:
            current = _current_config(conn)
            if current is not None:
                return current, False
            seeded = _config(conn.execute(_SEED_CONFIG, params).fetchone())
            event = AuditEvent(actor, CONFIG_SEEDED, CONFIG_SUBJECT, {"version": seeded.version})
            insert_audit(conn, now, event)
            return seeded, True

        return await self._write(work)

    async def append_audit(self, event: AuditEvent) -> AuditRecord:
        return await self._write(partial(insert_audit, at=_ts(self._clock.now()), event=event))

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

        def work(conn: sqlite3.Connection) -> list[AuditRecord]:
            return [audit_record(row) for row in conn.execute(sql, params)]

        return await self._read(work)

    async def idem_begin(
        self, key: str, fingerprint: str, *, ttl_s: float, owner: str
    ) -> IdemBegin:
        now = self._clock.now()
        params = {"key": key, "fingerprint": fingerprint, "owner": owner, "now": _ts(now)}
        params["expires_at"] = _ts(now + timedelta(seconds=ttl_s))

        def work(conn: sqlite3.Connection) -> IdemBegin:
            if conn.execute(_IDEM_BEGIN, params).fetchone() is not None:
                return Started()
            row = conn.execute(_IDEM_HELD, params).fetchone()
            if row is None:
                raise StoreError(f"idempotency key {key!r} vanished inside its transaction")
            completed = _idem_record(row) if row[2] == "completed" else None
            return idem_verdict(fingerprint, row[1], completed)

        return await self._write(work)

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
        expires_at = None if ttl_s is None else _ts(now + timedelta(seconds=ttl_s))
        params = {"key": key, "owner": owner, "status": status, "body": body}
        params |= {"headers": _headers_json(headers), "now": _ts(now), "expires_at": expires_at}
        return await self._write(lambda conn: conn.execute(_IDEM_COMPLETE, params).rowcount == 1)

    async def idem_abandon(self, key: str, owner: str) -> bool:
        params = {"key": key, "owner": owner, "now": _ts(self._clock.now())}
        return await self._write(lambda conn: conn.execute(_IDEM_ABANDON, params).rowcount == 1)

    async def idem_purge_expired(self) -> int:
        params = {"now": _ts(self._clock.now())}
        return await self._write(lambda conn: conn.execute(_IDEM_PURGE, params).rowcount)

    # --- the hop to the store's thread -------------------------------------------------------

    async def _read(self, work: Callable[[sqlite3.Connection], T]) -> T:
        return await self._hop(work)

    async def _write(self, work: Callable[[sqlite3.Connection], T]) -> T:
        return await self._hop(partial(_in_transaction, work))

    async def _hop(self, work: Callable[[sqlite3.Connection], T]) -> T:
        if self._executor is None:
            raise StoreUnavailable(f"the SQLite store {self._path} is not open")
        return await self._submit(self._executor, partial(self._with_connection, work))

    async def _submit(self, executor: ThreadPoolExecutor, call: Callable[[], T]) -> T:
        """Run ``call`` on the store's thread; the one place SQLite's exceptions become ours."""
        try:
            return await asyncio.get_running_loop().run_in_executor(executor, call)
        except sqlite3.Error as exc:
            code = getattr(exc, "sqlite_errorcode", -1) & 0xFF
            kind = StoreUnavailable if code in _UNAVAILABLE_CODES else StoreError
            raise kind(f"SQLite store {self._path}: {exc}") from exc
        except OSError as exc:
            raise StoreUnavailable(f"SQLite store {self._path}: {exc}") from exc

    def _with_connection(self, work: Callable[[sqlite3.Connection], T]) -> T:
        if self._conn is None:
            raise StoreUnavailable(f"the SQLite store {self._path} is closed")
        return work(self._conn)

    def _connect(self) -> int:
        if self._path != MEMORY:
            Path(self._path).parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(self._path, check_same_thread=False, isolation_level=None)
        try:
            if self._trace is not None:
                conn.set_trace_callback(self._trace)
            for pragma in _PRAGMAS:
                conn.execute(pragma)
            version = _schema_version(conn)
        except BaseException:
            conn.close()
            raise
        self._conn = conn
        return version

    def _disconnect(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()


def _in_transaction(work: Callable[[sqlite3.Connection], T], conn: sqlite3.Connection) -> T:
    conn.execute("BEGIN IMMEDIATE")
    try:
        result = work(conn)
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return result


def _apply_migrations(
    migrations: list[Migration], now: str, conn: sqlite3.Connection
) -> tuple[list[str], int]:
    conn.execute(_CREATE_SCHEMA_MIGRATIONS)
    applied = {row[0] for row in conn.execute("SELECT version FROM schema_migrations")}
    names: list[str] = []
    for migration in pending(migrations, applied):
        try:
            for statement in _statements(migration.sql):
                conn.execute(statement)
        except sqlite3.Error as exc:
            raise MigrationError(f"migration sqlite/{migration.name} failed: {exc}") from exc
        conn.execute(
            "INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, ?)",
            (migration.version, migration.name, now),
        )
        names.append(migration.name)
    return names, _schema_version(conn)


def _statements(script: str) -> Iterator[str]:
    """The statements of a SQL script, one by one (``executescript`` would commit first)."""
    buffer = ""
    for line in script.splitlines(keepends=True):
        buffer += line
        if sqlite3.complete_statement(buffer):
            yield buffer.strip()
            buffer = ""
    leftover = [line for line in buffer.splitlines() if line.strip() and not _comment(line)]
    if leftover:
        raise MigrationError(f"SQL script ends inside a statement: {leftover[0].strip()!r}")


def _comment(line: str) -> bool:
    return line.strip().startswith("--")


def _schema_version(conn: sqlite3.Connection) -> int:
    found = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_migrations'"
    ).fetchone()
    if found is None:
        return 0
    return int(
        conn.execute("SELECT coalesce(max(version), 0) FROM schema_migrations").fetchone()[0]
    )


def _current_config(conn: sqlite3.Connection) -> ConfigVersion | None:
    row = conn.execute(f"{_SELECT_CONFIG} ORDER BY version DESC LIMIT 1").fetchone()
    return None if row is None else _config(row)


def _config(row: tuple[Any, ...]) -> ConfigVersion:
    version, document, created_at, actor, note = row
    return ConfigVersion(version, json.loads(document), _dt(created_at), actor, note)


def _idem_record(row: tuple[Any, ...]) -> IdemRecord:
    key, fingerprint, _state, status, headers, body, created_at, expires_at = row
    pairs = tuple((str(name), str(value)) for name, value in json.loads(headers))
    return IdemRecord(
        key, fingerprint, status, pairs, bytes(body), _dt(created_at), _dt(expires_at)
    )


def _headers_json(headers: Sequence[tuple[str, str]]) -> str:
    return _json([[name, value] for name, value in headers])
