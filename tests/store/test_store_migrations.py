from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import pytest

from gpugate.errors import StoreUnavailable
from gpugate.store.migrations import load_migrations

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from gpugate.store import Store

MIGRATION_FOLDER = {"sqlite": "sqlite", "postgresql": "postgres"}


def shipped_names(store: Store) -> list[str]:
    return [migration.name for migration in load_migrations(MIGRATION_FOLDER[store.backend])]


def newest_version(store: Store) -> int:
    return load_migrations(MIGRATION_FOLDER[store.backend])[-1].version


def test_every_backend_ships_the_same_migrations_numbered_from_one() -> None:
    sqlite = load_migrations("sqlite")
    postgres = load_migrations("postgres")

    assert [m.name for m in sqlite] == [m.name for m in postgres]
    # Versions 8-15 are handed out to branches built side by side (jobs 8-9, hardenb 10-11,
    # identity 12-15), so one branch alone may skip some of them; none may go unclaimed.
    reserved = set(range(8, 16))
    for migrations in (sqlite, postgres):
        versions = [m.version for m in migrations]
        newest = max(versions)
        assert set(range(1, newest + 1)) - reserved <= set(versions)
        assert sorted(versions) == versions
    assert ["0001_initial", "0002_idempotency"] == [m.name for m in sqlite][:2]


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
