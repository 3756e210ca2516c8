from __future__ import annotations

import asyncio
import re
from typing import TYPE_CHECKING

import pytest

from gpugate.errors import MigrationError, StoreUnavailable
from gpugate.store.dialect import POSTGRES, SQLITE
from gpugate.store.migrations import load_migrations, render

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from gpugate.store import Store

DIALECT = {"sqlite": SQLITE, "postgresql": POSTGRES}  # a store's backend, its dialect


def shipped_names(store: Store) -> list[str]:
    return [migration.name for migration in load_migrations(DIALECT[store.backend])]


def newest_version(store: Store) -> int:
    return load_migrations(DIALECT[store.backend])[-1].version


def test_the_migrations_shipped_are_numbered_from_one_in_order() -> None:
    migrations = load_migrations(SQLITE)  # one file each, for both backends

    # Versions 8-15 are handed out to branches built side by side (jobs 8-9, hardenb 10-11,
    # identity 12-15), so one branch alone may skip some of them; none may go unclaimed.
    reserved = set(range(8, 16))
    versions = [m.version for m in migrations]
    assert set(range(1, max(versions) + 1)) - reserved <= set(versions)
    assert sorted(versions) == versions
    assert ["0001_initial", "0002_idempotency"] == [m.name for m in migrations][:2]


def test_a_migration_is_one_file_whose_named_types_become_each_backends_own() -> None:
    text = "CREATE TABLE t (id {ID}, at {TIME} NOT NULL, detail {JSON} NOT NULL DEFAULT '{}');"

    assert render(text, SQLITE) == (
        "CREATE TABLE t (id INTEGER PRIMARY KEY AUTOINCREMENT, at TEXT NOT NULL,"
        " detail TEXT NOT NULL DEFAULT '{}');\n"
    )
    assert render(text, POSTGRES) == (
        "CREATE TABLE t (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, at timestamptz"
        " NOT NULL, detail jsonb NOT NULL DEFAULT '{}');\n"
    )


def test_an_inline_part_and_a_block_are_kept_for_their_backend_only() -> None:
    text = (
        "ALTER TABLE t ADD COLUMN n integer{postgres: NOT NULL}{sqlite: DEFAULT 0};\n"
        "-- if sqlite\n"
        "CREATE INDEX t_n ON t (n);\n"
        "-- if postgres\n"
        "CREATE INDEX t_n ON t (n) WHERE n > 0;\n"
        "-- end\n"
        "SELECT 1;"
    )

    assert render(text, SQLITE).splitlines() == [
        "ALTER TABLE t ADD COLUMN n integer DEFAULT 0;",
        "CREATE INDEX t_n ON t (n);",
        "SELECT 1;",
    ]
    assert render(text, POSTGRES).splitlines() == [
        "ALTER TABLE t ADD COLUMN n integer NOT NULL;",
        "CREATE INDEX t_n ON t (n) WHERE n > 0;",
        "SELECT 1;",
    ]


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("SELECT 1;\nCREATE TABLE t (at {TIMESTAMP});", "0099_x.sql:2: no type {TIMESTAMP}"),
        ("CREATE TABLE t (n integer{mysql: UNSIGNED});", "0099_x.sql:1: no backend 'mysql'"),
        ("-- if oracle\nSELECT 1;\n-- end", "0099_x.sql:1: no backend 'oracle'"),
        ("-- if postgres\nSELECT 1;", "0099_x.sql: the last '-- if postgres' has no '-- end'"),
    ],
)
def test_a_migration_naming_what_is_not_there_is_an_error_saying_where(
    text: str, says: str
) -> None:
    for backend in (SQLITE, POSTGRES):
        with pytest.raises(MigrationError) as raised:
            render(text, backend, "0099_x.sql")
        assert says in str(raised.value)


def test_every_shipped_migration_renders_with_no_brace_or_block_left() -> None:
    for backend in (SQLITE, POSTGRES):
        for migration in load_migrations(backend):
            assert "-- if " not in migration.sql
            assert "-- end" not in migration.sql
            statements = "\n".join(line.split("--")[0] for line in migration.sql.splitlines())
            assert not re.search(r"\{[A-Za-z]", statements), migration.name


async def test_migrate_applies_every_migration_in_order_and_reports_their_names(
    open_unmigrated: Callable[[], Awaitable[Store]],
) -> None:
    store = await open_unmigrated()

    applied = await store.migrate()

    assert shipped_names(store) == applied


async def test_migrate_applies_nothing_when_the_schema_is_current(store: Store) -> None:
    assert [] == await store.migrate()


async def test_schema_version_is_zero_before_migrating_and_the_newest_migration_after(
    open_unmigrated: Callable[[], Awaitable[Store]],
) -> None:
    store = await open_unmigrated()
    before = await store.schema_version()

    await store.migrate()

    assert 0 == before
    assert newest_version(store) == await store.schema_version()


async def test_two_stores_migrating_at_once_apply_each_migration_exactly_once(
    open_unmigrated: Callable[[], Awaitable[Store]],
) -> None:
    first, second = await open_unmigrated(), await open_unmigrated()

    applied = await asyncio.gather(first.migrate(), second.migrate())

    assert sorted(shipped_names(first)) == sorted(applied[0] + applied[1])
    assert await first.schema_version() == await second.schema_version()


async def test_repr_names_the_backend_and_the_schema_version(store: Store) -> None:
    prefix = {"sqlite": "<SqliteStore path=", "postgresql": "<PostgresStore dsn="}[store.backend]

    assert repr(store).startswith(prefix)
    assert f"schema={newest_version(store)}>" in repr(store)


async def test_an_open_store_answers_ping(store: Store) -> None:
    await store.ping()

    assert "closed" not in repr(store)


async def test_a_closed_store_answers_ping_with_store_unavailable(store: Store) -> None:
    await store.close()

    with pytest.raises(StoreUnavailable):
        await store.ping()
    assert repr(store).endswith(" closed>")


async def test_closing_a_store_twice_is_harmless(store: Store) -> None:
    await store.close()
    await store.close()

    assert repr(store).endswith(" closed>")
