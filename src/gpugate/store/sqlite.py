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
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, date, datetime
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

from gpugate.errors import MigrationError, StoreError, StoreUnavailable
from gpugate.store.dialect import Json
from gpugate.store.migrations import Migration, load_migrations, pending, schema_version
from gpugate.store.replicas import replica_id
from gpugate.store.sql_store import Store
from gpugate.store.tx import SKIPPED, SQLITE_CODEC, Codec, Result, Rollback

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence

    from gpugate.clock import Clock
    from gpugate.store.dialect import Query
    from gpugate.store.tx import Tx

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


class SqliteStore(Store):
    """The embedded store: a SQLite file in WAL mode, reached through one worker thread.

    Every method is written once (:class:`Store`); this is its driver: each transaction is
    one hop to the thread, which runs all its steps (:mod:`gpugate.store.tx`).
    """

    backend = "sqlite"
    _codec: Codec = SQLITE_CODEC

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

    def _describe(self) -> tuple[str, bool]:
        return f"path={self._path}", self._executor is not None

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
        await self._hop(lambda conn: conn.execute("SELECT 1").fetchone())

    async def migrate(self) -> list[str]:
        work = partial(
            _apply_migrations, load_migrations(self._codec.dialect), _ts(self._clock.now())
        )
        applied, self._schema = await self._write(work)
        return applied

    async def schema_version(self) -> int:
        self._schema = await self._query(schema_version())
        return self._schema

    # --- the hop to the store's thread -------------------------------------------------------

    async def _transact(self, tx: Tx[T], *, single: bool = False) -> T:
        del single  # one writer: every write is one IMMEDIATE transaction
        try:
            return await self._write(partial(_drive, tx))
        except Rollback as rollback:
            return cast("T", rollback.value)

    async def _query(self, tx: Tx[T], *, single: bool = True) -> T:
        del single  # reads need no transaction on the store's one connection
        return await self._hop(partial(_drive, tx))

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
            version = _drive(schema_version(), conn)
        except BaseException:
            conn.close()
            raise
        self._conn = conn
        return version

    def _disconnect(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()


def _drive(tx: Tx[T], conn: sqlite3.Connection) -> T:
    """Run the transaction's steps on ``conn`` (the store's thread), one after the other."""
    try:
        step = next(tx)
        while True:
            step = tx.send(_execute(conn, *step))
    except StopIteration as stop:
        return cast("T", stop.value)


def _execute(
    conn: sqlite3.Connection, query: Query, params: Mapping[str, Any] | Sequence[Mapping[str, Any]]
) -> Result:
    text = query.sqlite
    if text is None:
        return SKIPPED
    if isinstance(params, Mapping):
        cursor = conn.execute(text, _encoded(params))
    else:
        cursor = conn.executemany(text, [_encoded(each) for each in params])
    found = cursor.fetchall()
    return Result(found, cursor.rowcount)


def _time_in_json(value: object) -> str:
    if isinstance(value, datetime):
        return _ts(value)
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), default=_time_in_json)
"""Compact JSON, non-ASCII kept as is; a time in it (a batch's rows) as :func:`_ts`."""


def _ts(moment: datetime) -> str:
    """Fixed-width ISO-8601 UTC, so that text order is time order."""
    return moment.astimezone(UTC).isoformat(timespec="microseconds")


_PLAIN = frozenset({str, int, float, bool, bytes, type(None)})


def _encoded(params: Mapping[str, Any]) -> dict[str, Any]:
    plain = _PLAIN
    return {n: v if type(v) in plain else _encode(v) for n, v in params.items()}


def _encode(value: Any) -> Any:
    if isinstance(value, datetime):
        return _ts(value)
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, Json):
        try:
            return _ENCODER.encode(value.value)
        except (TypeError, ValueError) as exc:  # as psycopg's Jsonb: the group commit retries
            raise StoreError(f"a value JSON cannot hold: {exc}") from exc
    return value


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
    return names, _drive(schema_version(), conn)


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
