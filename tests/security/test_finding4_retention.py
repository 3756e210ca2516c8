"""Finding 4 (issue #15): jobs, events, audit, batches, files and blobs grew without bound, and
the idempotency purge existed but was never called. A ``retention:`` block and a purge loop
(``services/retention.py``) delete finished rows older than it, in bounded batches, on both
backends; what is young, or still running, stays."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gpugate.adapters.blobs import LocalBlobs
from gpugate.clock import ManualClock
from gpugate.config import RetentionConfig
from gpugate.core.job_states import NewJob
from gpugate.metrics import Metrics
from gpugate.services.retention import Retention
from gpugate.store import Store
from gpugate.store.base import AuditEvent
from gpugate.store.facade_base import FileRecord, NewBatch
from gpugate.store.factory import open_store
from harness import eventually

DAY = 86400.0
RETENTION = RetentionConfig(jobs_s=2 * DAY, audit_s=3 * DAY, batches_s=2 * DAY, batch_rows=3)


@pytest.fixture
def blobs(tmp_path: Path) -> LocalBlobs:
    return LocalBlobs(str(tmp_path / "blobs"))


@pytest.fixture
async def store(dsn: str) -> AsyncIterator[tuple[Store, ManualClock]]:
    clock = ManualClock(datetime(2026, 1, 1, tzinfo=UTC))
    opened = open_store(dsn, clock=clock)
    await opened.open()
    await opened.migrate()
    try:
        yield opened, clock
    finally:
        await opened.close()


async def finished_job(store: Store, blobs: LocalBlobs, n: int) -> str:
    """A job that ran and completed with its result in a blob."""
    job, _ = await store.create_job(NewJob(model="m", input={"n": n}, runner="local"))
    claimed = await store.claim_job(job.slug, lease_s=60)
    assert claimed is not None
    assert claimed.lease_token is not None
    key = f"results/{job.slug}"
    await blobs.put(key, b"{}", content_type="application/json")
    assert await store.complete(
        job.slug, claimed.lease_token, result=None, result_ref=key, actor="dispatcher"
    )
    return job.slug


async def ended_batch(store: Store, blobs: LocalBlobs, clock: ManualClock, n: int) -> str:
    """A batch that completed, with its input, output and error files (blobs too)."""
    ids = [f"file-{n}-{kind}" for kind in ("in", "out", "err")]
    for file_id in ids:
        await blobs.put(f"files/{file_id}", b"x\n", content_type="application/jsonl")
        await store.create_file(
            FileRecord(file_id, "batch", "f.jsonl", 2, f"files/{file_id}", clock.now())
        )
    batch = NewBatch(f"batch-{n}", "/v1/chat/completions", ids[0], "24h", 1, None, clock.now())
    await store.create_batch(batch)
    held = await store.claim_batch("test", lease_s=60)
    assert held is not None
    assert batch.id == held.id
    await store.finish_batch(
        batch.id, "test", status="completed", output_file_id=ids[1], error_file_id=ids[2]
    )
    return batch.id


async def test_finding4_finished_rows_older_than_retention_are_purged_in_bounded_batches(
    store: tuple[Store, ManualClock], blobs: LocalBlobs, tmp_path: Path
) -> None:
    db, clock = store
    metrics = Metrics()
    retention = Retention(db, blobs, clock, lambda: RETENTION, metrics=metrics)
    old_jobs = [await finished_job(db, blobs, n) for n in range(7)]  # > 2 batches of 3
    old_batches = [await ended_batch(db, blobs, clock, n) for n in range(4)]
    await db.create_file(FileRecord("file-unused", "batch", "u.jsonl", 0, "files/u", clock.now()))
    for n in range(5):
        await db.append_audit(AuditEvent("test", "test.old", f"s{n}", {}))
    await db.idem_begin("old-key", "fp", owner="o", ttl_s=DAY)

    clock.advance(2.5 * DAY)  # jobs and batches are old now, the audit events not yet
    running, _ = await db.create_job(NewJob(model="m", input={}, runner="local"))
    young = await finished_job(db, blobs, 99)
    purged = await retention.purge_once()

    assert {"jobs": 7, "batches": 4 + 12 + 1, "audit": 0, "idempotency": 1} == {
        k: purged[k] for k in ("jobs", "batches", "audit", "idempotency")
    }
    purged_jobs = metrics.registry.get_sample_value(
        "gateway_retention_purged_total", {"kind": "jobs"}
    )
    assert 7 == purged_jobs
    assert [None] * 7 == [await db.get_job(slug) for slug in old_jobs]
    assert [] == [e for slug in old_jobs for e in await db.job_events(slug)]
    assert [None] * 4 == [await db.get_batch(b) for b in old_batches]
    assert (await db.get_job(running.slug)) is not None  # not finished: kept however old
    assert (await db.get_job(young)) is not None
    left = sorted(p.name for p in (tmp_path / "blobs").rglob("*") if p.is_file())
    assert [young] == left  # every purged row's blob went with it

    clock.advance(1 * DAY)  # the audit events are 3.5 days old now
    assert 5 <= (await retention.purge_once())["audit"]
    counts = await db.table_counts()
    assert (2, 0, 0) == (counts["jobs"], counts["batches"], counts["batch_files"])


async def test_finding4_the_purge_loop_runs_at_start_and_again_every_every_s(
    store: tuple[Store, ManualClock], blobs: LocalBlobs
) -> None:
    db, clock = store
    retention = Retention(db, blobs, clock, lambda: RETENTION)
    await finished_job(db, blobs, 1)
    clock.advance(3 * DAY)
    loop = asyncio.create_task(retention.run())
    try:
        await eventually(lambda: retention.totals.passes == 1, what="the pass at start")
        assert 1 == retention.totals.rows["jobs"]
        await finished_job(db, blobs, 2)
        clock.advance(3 * DAY)  # past the job's retention and the loop's every_s
        await eventually(lambda: retention.totals.passes == 2, what="the next pass")
    finally:
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)
    assert (2, 0) == (retention.totals.rows["jobs"], (await db.table_counts())["jobs"])
