"""One contract suite, every backend: the ``store`` fixture runs each test on SQLite and PostgreSQL.

PostgreSQL comes from ``GPUGATE_TEST_POSTGRES``. When that variable is set, an unreachable
server fails the PostgreSQL tests; when it is unset, a local server is probed once and the
PostgreSQL tests are skipped (with one summary line) if it does not answer. Each PostgreSQL test
gets a fresh schema, named in the DSN's ``options``, dropped afterwards.
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import quote

import psycopg
import pytest

from gpugate.clock import ManualClock
from gpugate.store import Store
from gpugate.store.factory import open_store

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable
    from pathlib import Path

POSTGRES_ENV = "GPUGATE_TEST_POSTGRES"
LOCAL_POSTGRES = "postgresql://postgres@127.0.0.1:5432/test"
POSTGRES_SKIP = f"PostgreSQL not reachable at {LOCAL_POSTGRES}; set {POSTGRES_ENV} to require it"


@dataclass(frozen=True, slots=True)
class Target:
    """Where a test's store lives: its backend, its DSN and (PostgreSQL) its schema."""

    backend: str
    dsn: str
    schema: str | None = None


@pytest.fixture(scope="session")
def postgres_dsn() -> str:
    """The PostgreSQL server for this session, probed once."""
    required = os.environ.get(POSTGRES_ENV)
    dsn = required or LOCAL_POSTGRES
    try:
        with psycopg.connect(dsn, connect_timeout=3):
            pass
    except psycopg.OperationalError as exc:
        if required:
            reason = str(exc).strip().splitlines()[0]
            pytest.fail(f"{POSTGRES_ENV} is set but PostgreSQL is not reachable: {reason}")
        pytest.skip(POSTGRES_SKIP)
    return dsn


@pytest.fixture
async def postgres_target(postgres_dsn: str) -> AsyncIterator[Target]:
    """A fresh schema on the session's PostgreSQL, named in the DSN, dropped afterwards."""
    schema = f"gg_{secrets.token_hex(6)}"
    async with await psycopg.AsyncConnection.connect(postgres_dsn, autocommit=True) as conn:
        await conn.execute(f"CREATE SCHEMA {schema}")
    try:
        yield Target("postgresql", with_search_path(postgres_dsn, schema), schema)
    finally:
        async with await psycopg.AsyncConnection.connect(postgres_dsn, autocommit=True) as conn:
            await conn.execute(f"DROP SCHEMA {schema} CASCADE")


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Target:
    if request.param == "sqlite":
        return Target("sqlite", f"sqlite:///{tmp_path / 'gpugate.db'}")
    postgres: Target = request.getfixturevalue("postgres_target")
    return postgres


def with_search_path(dsn: str, schema: str) -> str:
    """``dsn`` with ``options=-c search_path=<schema>`` added to its query string."""
    joiner = "&" if "?" in dsn else "?"
    return f"{dsn}{joiner}options={quote(f'-csearch_path={schema}', safe='')}"


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
async def open_unmigrated(
    target: Target, clock: ManualClock
) -> AsyncIterator[Callable[[], Awaitable[Store]]]:
    """Opens more stores on the test's database (not migrated); all are closed afterwards."""
    opened: list[Store] = []

    async def open_one() -> Store:
        store = open_store(target.dsn, clock=clock)
        await store.open()
        opened.append(store)
        return store

    yield open_one
    for store in opened:
        await store.close()


@pytest.fixture
async def open_another(
    open_unmigrated: Callable[[], Awaitable[Store]],
) -> Callable[[], Awaitable[Store]]:
    """Opens another migrated store on the same database, as a second process would."""

    async def open_one() -> Store:
        store = await open_unmigrated()
        await store.migrate()
        return store

    return open_one


@pytest.fixture
async def store(open_another: Callable[[], Awaitable[Store]]) -> Store:
    """An open, migrated store on an empty database."""
    return await open_another()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Say in the run's output how the store contract suite went on each back end."""
    counts: dict[str, dict[str, int]] = {}
    for outcome in ("passed", "failed", "error", "skipped"):
        for report in terminalreporter.stats.get(outcome, []):
            nodeid = getattr(report, "nodeid", "")
            if "tests/store/" not in nodeid or getattr(report, "when", "call") not in (
                "call",
                "setup",
            ):
                continue
            if outcome == "passed" and report.when != "call":
                continue
            backend = next((b for b in ("sqlite", "postgresql") if f"[{b}" in nodeid), None)
            if backend is not None:
                by = counts.setdefault(backend, {})
                by[outcome] = by.get(outcome, 0) + 1
    if counts:
        parts = [
            f"{backend}: " + ", ".join(f"{n} {o}" for o, n in sorted(by.items()))
            for backend, by in sorted(counts.items())
        ]
        terminalreporter.write_line("store contract suite — " + " | ".join(parts))
