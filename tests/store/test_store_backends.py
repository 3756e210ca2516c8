from __future__ import annotations

import asyncio
import threading
import time
from typing import TYPE_CHECKING

import psycopg
import pytest

from gpugate.errors import StoreError, StoreUnavailable
from gpugate.store import AuditEvent
from gpugate.store.factory import open_store
from gpugate.store.postgres import PostgresStore, redact_dsn
from gpugate.store.sqlite import SqliteStore

if TYPE_CHECKING:
    from pathlib import Path

    from conftest import Target
    from gpugate.clock import ManualClock


@pytest.mark.parametrize(
    "dsn",
    [
        "mysql://root@127.0.0.1/gpugate",
        "sqlite://gpugate.db",
        "sqlite:///",
        "gpugate.db",
        "",
    ],
)
def test_a_dsn_of_no_accepted_form_is_refused_naming_the_accepted_forms(
    dsn: str, clock: ManualClock
) -> None:
    with pytest.raises(StoreError, match=r"sqlite:///.*sqlite:////.*postgresql://"):
        open_store(dsn, clock=clock)


def test_a_refused_dsn_is_not_echoed_with_its_password(clock: ManualClock) -> None:
    with pytest.raises(StoreError) as caught:
        open_store("mysql://root:hunter2@127.0.0.1/gpugate", clock=clock)

    assert "hunter2" not in str(caught.value)


@pytest.mark.parametrize(
    ("dsn", "expected_path"),
    [("sqlite:///data/gpugate.db", "data/gpugate.db"), ("sqlite:////var/gg.db", "/var/gg.db")],
)
def test_sqlite_dsns_name_a_relative_or_an_absolute_path(
    dsn: str, expected_path: str, clock: ManualClock
) -> None:
    store = open_store(dsn, clock=clock)

    assert isinstance(store, SqliteStore)
    assert expected_path == store.path
    assert "sqlite" == store.backend


@pytest.mark.parametrize("scheme", ["postgresql", "postgres"])
def test_both_postgres_schemes_make_a_postgres_store_without_connecting(
    scheme: str, clock: ManualClock
) -> None:
    store = open_store(f"{scheme}://postgres@127.0.0.1:1/test", clock=clock)

    assert isinstance(store, PostgresStore)
    assert "postgresql" == store.backend
    assert repr(store).endswith("schema=? closed>")


def test_a_redacted_dsn_keeps_everything_but_the_password() -> None:
    dsn = "postgresql://gg:hunter2@db.internal:6432/gpugate?password=hunter2&sslmode=require"

    assert "postgresql://gg@db.internal:6432/gpugate?sslmode=require" == redact_dsn(dsn)


async def test_an_unreachable_postgres_raises_store_unavailable_quickly_in_one_line(
    clock: ManualClock,
) -> None:
    store = open_store("postgresql://postgres:hunter2@127.0.0.1:1/test", clock=clock)
    started = time.monotonic()

    with pytest.raises(StoreUnavailable) as caught:
        await store.open()

    assert time.monotonic() - started < 6
    message = str(caught.value)
    assert "postgresql://postgres@127.0.0.1:1/test" in message
    assert "hunter2" not in message
    assert "\n" not in message


async def test_a_store_used_before_open_raises_store_unavailable(
    target: Target, clock: ManualClock
) -> None:
    store = open_store(target.dsn, clock=clock)

    with pytest.raises(StoreUnavailable, match="not open"):
        await store.current_config()


async def test_the_sqlite_store_creates_the_missing_parent_directories(
    tmp_path: Path, clock: ManualClock
) -> None:
    path = tmp_path / "a" / "b" / "gpugate.db"
    store = open_store(f"sqlite:///{path}", clock=clock)

    await store.open()
    await store.close()

    assert path.is_file()


async def test_a_relative_sqlite_path_is_relative_to_the_working_directory(
    tmp_path: Path, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    store = open_store("sqlite:///state/gpugate.db", clock=clock)

    await store.open()
    await store.close()

    assert (tmp_path / "state" / "gpugate.db").is_file()


async def test_a_sqlite_path_that_cannot_be_created_raises_store_unavailable(
    tmp_path: Path, clock: ManualClock
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    store = open_store(f"sqlite:///{blocker / 'gpugate.db'}", clock=clock)

    with pytest.raises(StoreUnavailable, match="a-file"):
        await store.open()
    assert repr(store).endswith(" closed>")


async def test_the_sqlite_store_runs_every_statement_on_one_thread_off_the_event_loop(
    tmp_path: Path, clock: ManualClock
) -> None:
    statements: list[tuple[int, str]] = []
    store = SqliteStore(
        str(tmp_path / "gpugate.db"),
        clock=clock,
        trace=lambda sql: statements.append((threading.get_ident(), sql)),
    )
    await store.open()
    try:
        await store.migrate()
        await asyncio.gather(
            store.save_config({"upstreams": []}, actor="a", note=""),
            store.append_audit(AuditEvent("a", "x.y", "z")),
            store.idem_begin("k", "f", ttl_s=1, owner="o"),
        )
        await store.list_audit()
    finally:
        await store.close()

    threads = {ident for ident, _ in statements}
    assert len(statements) > 10
    assert threading.get_ident() not in threads
    assert 1 == len(threads)


async def test_a_sqlite_write_is_one_immediate_transaction(
    tmp_path: Path, clock: ManualClock
) -> None:
    statements: list[str] = []
    store = SqliteStore(str(tmp_path / "gpugate.db"), clock=clock, trace=statements.append)
    await store.open()
    await store.migrate()
    statements.clear()

    await store.save_config({"upstreams": []}, actor="a", note="")
    await store.close()

    assert "BEGIN IMMEDIATE" == statements[0]
    assert "COMMIT" == statements[-1]
    assert 4 == len(statements)


@pytest.mark.postgres
async def test_the_postgres_store_creates_its_tables_in_the_schema_named_by_the_dsn(
    postgres_target: Target, postgres_dsn: str, clock: ManualClock
) -> None:
    store = open_store(postgres_target.dsn, clock=clock)
    await store.open()
    try:
        await store.migrate()
    finally:
        await store.close()

    async with await psycopg.AsyncConnection.connect(postgres_dsn) as conn:
        cursor = await conn.execute(
            "SELECT to_regclass(%s) IS NOT NULL", (f"{postgres_target.schema}.config_versions",)
        )
        row = await cursor.fetchone()
    assert (True,) == row
