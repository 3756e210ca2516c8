"""A job's lease is typed columns (issue #17): who holds it is read, never parsed from text."""

from __future__ import annotations

from typing import TYPE_CHECKING

import psycopg
import pytest

import gpugate.store.postgres
import gpugate.store.sqlite
from gpugate.core.lease import RESERVED_CALL, Lease
from gpugate.store import NewJob
from gpugate.store.dialect import POSTGRES, SQLITE
from gpugate.store.migrations import load_migrations

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from conftest import Target
    from gpugate.store import JobRecord, Store


async def claimed(store: Store, slug: str = "j1") -> JobRecord:
    await store.create_job(NewJob(model="m", input={}, runner="rt", slug=slug))
    job = await store.claim_job(slug, lease_s=600)
    assert job is not None
    assert job.lease_token is not None
    return job


async def stored(store: Store, slug: str) -> JobRecord:
    job = await store.get_job(slug)
    assert job is not None
    return job


async def test_a_claim_a_reserved_slot_and_a_call_are_each_their_own_lease(store: Store) -> None:
    job = await claimed(store)
    token = job.lease_token
    assert token is not None
    claim = Lease.claim(store.replica)
    assert (claim, claim) == (job.lease, (await stored(store, "j1")).lease)

    reserved = await store.reserve_call("j1", token, "rt", max_concurrency=2, cost=None)
    held = await stored(store, "j1")
    assert ("reserved", "reservation", "rt") == (reserved, held.lease_kind, held.lease_runtime)
    assert ("rt", RESERVED_CALL) == held.call
    assert 1 == await store.count_leased("rt")

    await store.release_call("j1", token, "rt")
    assert claim == (await stored(store, "j1")).lease
    assert 0 == await store.count_leased("rt")

    await store.record_submit("j1", token, runtime="rt", call_id="c-9", lease_s=60, running=True)
    called = await stored(store, "j1")
    assert (Lease.of_call("rt", "c-9"), ("rt", "c-9")) == (called.lease, called.call)
    assert "rt:c-9" == called.leased_by  # the text beside the columns, for people
    assert 1 == await store.count_leased("rt")


async def test_a_lease_that_ends_clears_every_lease_column(store: Store) -> None:
    job = await claimed(store)
    assert job.lease_token is not None

    assert await store.release(job.slug, job.lease_token)

    after = await stored(store, job.slug)
    lease = (after.lease_kind, after.lease_runtime, after.lease_call_id, after.lease_replica)
    assert (None, None, (None,) * 4) == (after.lease, after.leased_by, lease)


OLD_ROWS = [
    ("c1", "dispatching", "c1-dispatcher@host-1-abc"),
    ("c2", "dispatching", "c2-dispatcher"),
    ("r1", "dispatching", "rt:~reserved"),
    ("k1", "running", "rt:call-7"),
    ("q1", "queued", None),
]


def insert_old_rows(target: Target) -> None:
    """Jobs as the schema before 0016 held them: the lease only as leased_by text."""
    sql = (
        "INSERT INTO jobs (slug, model, class, runner, state, leased_by, lease_token,"
        " lease_expires_at, created_at, updated_at) VALUES ({})"
    )
    when = "2026-01-01T00:00:00.000000+00:00"
    rows = [
        (slug, "m", "batch", "rt", state, held, "t", when, when, when)
        for slug, state, held in OLD_ROWS
    ]
    if target.backend == "sqlite":
        import sqlite3

        with sqlite3.connect(target.dsn.removeprefix("sqlite:///")) as conn:
            conn.executemany(sql.format(", ".join("?" * 10)), rows)
        return
    with psycopg.connect(target.dsn) as conn:
        conn.cursor().executemany(sql.format(", ".join(["%s"] * 10)), rows)


async def test_the_lease_migration_types_the_leases_of_existing_rows(
    target: Target,
    open_unmigrated: Callable[[], Awaitable[Store]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = await open_unmigrated()
    for module, dialect in ((gpugate.store.sqlite, SQLITE), (gpugate.store.postgres, POSTGRES)):
        older = [m for m in load_migrations(dialect) if m.version < 16]
        monkeypatch.setattr(module, "load_migrations", lambda _backend, older=older: older)
    await store.migrate()
    insert_old_rows(target)
    monkeypatch.undo()

    assert ["0016_lease_columns"] == await store.migrate()

    leases = {slug: (await stored(store, slug)).lease for slug, _, _ in OLD_ROWS}
    assert {
        "c1": Lease.claim("host-1-abc"),
        "c2": Lease.claim(None),
        "r1": Lease.reservation("rt"),
        "k1": Lease.of_call("rt", "call-7"),
        "q1": None,
    } == leases
    assert 2 == await store.count_leased("rt")
