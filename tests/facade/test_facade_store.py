"""The façades' store: job lookup by key, files, batches, their leases and items — both backends."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta

import pytest

from gpugate.clock import ManualClock
from gpugate.store import NewJob, Store
from gpugate.store.facade_base import BatchItem, FileRecord, NewBatch
from gpugate.store.factory import open_store


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
async def store(dsn: str, clock: ManualClock) -> AsyncIterator[Store]:
    opened = open_store(dsn, clock=clock)
    await opened.open()
    await opened.migrate()
    try:
        yield opened
    finally:
        await opened.close()


async def a_batch(store: Store, clock: ManualClock, batch_id: str = "batch_1") -> None:
    await store.create_file(
        FileRecord(f"file-{batch_id}", "batch", "in.jsonl", 10, f"files/{batch_id}", clock.now())
    )
    new = NewBatch(
        batch_id,
        "/v1/chat/completions",
        f"file-{batch_id}",
        "24h",
        3,
        {"k": "v"},
        clock.now() + timedelta(hours=24),
    )
    await store.create_batch(new)


def item(line: int, *, ok: bool = True) -> BatchItem:
    return BatchItem(line, f"c{line}", ok, {"custom_id": f"c{line}", "line": line})


async def test_a_job_is_found_by_its_idempotency_key_and_only_by_it(store: Store) -> None:
    new = NewJob(
        slug=None, idempotency_key="k1", model="m", job_class="batch", input={}, runner="local"
    )
    job, _ = await store.create_job(new)

    found = await store.job_by_idempotency_key("k1")

    assert found is not None
    assert found.slug == job.slug
    assert await store.job_by_idempotency_key("k2") is None


async def test_a_file_is_stored_and_read_back(store: Store, clock: ManualClock) -> None:
    record = FileRecord("file-1", "batch", "in.jsonl", 42, "files/file-1", clock.now())

    await store.create_file(record)

    assert await store.get_file("file-1") == record
    assert await store.get_file("file-2") is None


async def test_a_new_batch_is_in_progress_with_no_items_and_no_owner(
    store: Store, clock: ManualClock
) -> None:
    await a_batch(store, clock)

    batch = await store.get_batch("batch_1")

    assert batch is not None
    assert (batch.status, batch.total, batch.completed, batch.failed) == ("in_progress", 3, 0, 0)
    assert (batch.owner, batch.metadata, batch.created_at) == (None, {"k": "v"}, clock.now())
    assert await store.batch_items("batch_1") == []


async def test_one_runner_holds_a_batch_until_its_lease_expires(
    store: Store, clock: ManualClock
) -> None:
    await a_batch(store, clock)

    first = await store.claim_batch("r1", lease_s=60)
    second = await store.claim_batch("r2", lease_s=60)
    assert await store.extend_batch_lease("batch_1", "r1", lease_s=60)
    clock.advance(61)
    taken = await store.claim_batch("r2", lease_s=60)

    assert first is not None
    assert first.owner == "r1"
    assert second is None
    assert taken is not None
    assert taken.owner == "r2"
    assert not await store.extend_batch_lease("batch_1", "r1", lease_s=60)


async def test_a_takeover_claims_a_batch_another_runner_holds_but_never_its_own(
    store: Store, clock: ManualClock
) -> None:
    await a_batch(store, clock)
    await store.claim_batch("r1", lease_s=60)

    own = await store.claim_batch("r1", lease_s=60, takeover=True)
    taken = await store.claim_batch("r2", lease_s=60, takeover=True)

    assert own is None
    assert taken is not None
    assert taken.owner == "r2"


async def test_an_item_is_recorded_once_and_counted_once(store: Store, clock: ManualClock) -> None:
    await a_batch(store, clock)

    recorded = [
        await store.record_batch_item("batch_1", item(2, ok=False)),
        await store.record_batch_item("batch_1", item(0)),
        await store.record_batch_item("batch_1", item(0)),
    ]
    batch = await store.get_batch("batch_1")

    assert recorded == [True, True, False]
    assert batch is not None
    assert (batch.completed, batch.failed) == (1, 1)
    assert await store.batch_items("batch_1") == [item(0), item(2, ok=False)]


async def test_cancel_moves_an_in_progress_batch_to_cancelling_only(
    store: Store, clock: ManualClock
) -> None:
    await a_batch(store, clock)

    cancelling = await store.cancel_batch("batch_1")
    again = await store.cancel_batch("batch_1")

    assert cancelling is not None
    assert (cancelling.status, cancelling.cancelling_at) == ("cancelling", clock.now())
    assert again == cancelling
    assert await store.cancel_batch("nope") is None


async def test_only_the_holder_finishes_a_batch_and_it_lets_go(
    store: Store, clock: ManualClock
) -> None:
    await a_batch(store, clock)
    await store.claim_batch("r1", lease_s=60)

    stranger = await store.finish_batch(
        "batch_1", "r2", status="completed", output_file_id="o", error_file_id=None
    )
    done = await store.finish_batch(
        "batch_1", "r1", status="completed", output_file_id="o", error_file_id="e"
    )

    assert stranger is None
    assert done is not None
    assert (done.status, done.owner, done.output_file_id, done.error_file_id) == (
        "completed",
        None,
        "o",
        "e",
    )
    assert done.completed_at == clock.now()
    assert done.terminal
    assert await store.claim_batch("r2", lease_s=60, takeover=True) is None


async def test_a_broken_run_is_counted_with_its_reason_and_lets_the_batch_go(
    store: Store, clock: ManualClock
) -> None:
    await a_batch(store, clock)
    claimed = await store.claim_batch("runner-a", lease_s=60)
    assert claimed is not None
    error = {"code": "STORE_ERROR", "message": "The store failed."}

    stranger = await store.break_batch("batch_1", "runner-b", error=error)
    first = await store.break_batch("batch_1", "runner-a", error=error)
    again = await store.claim_batch("runner-a", lease_s=60)  # let go: claimable at once
    second = await store.break_batch("batch_1", "runner-a", error={"code": "X", "message": "y"})
    batch = await store.get_batch("batch_1")

    assert (None, 1, 2) == (stranger, first, second)
    assert again is not None
    assert (1, error) == (again.breaks, again.error)
    assert batch is not None
    assert (2, {"code": "X", "message": "y"}, None) == (batch.breaks, batch.error, batch.owner)
