"""Operator verbs (cancel, retry), the reaper's expired leases and rescue, capacity counts."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

import pytest

from gpugate.store import LEASE_LOST, JobRecord, NewJob

if TYPE_CHECKING:
    from gpugate.clock import ManualClock
    from gpugate.store import Store


def new_job(**overrides: Any) -> NewJob:
    values: dict[str, Any] = {"model": "qwen-35b", "input": {"prompt": "hi"}, "runner": "local"}
    values.update(overrides)
    return NewJob(**values)


async def create(store: Store, **overrides: Any) -> JobRecord:
    job, _ = await store.create_job(new_job(**overrides))
    return job


async def claimed(store: Store, **overrides: Any) -> tuple[JobRecord, str]:
    job = await create(store, **overrides)
    lease = await store.claim_job(job.slug, lease_s=600)
    assert lease is not None
    assert lease.lease_token is not None
    return lease, lease.lease_token


async def submitted(
    store: Store, runtime: str = "home-1", call_id: str = "c-1", *, lease_s: float = 60
) -> tuple[JobRecord, str]:
    job, token = await claimed(store, runner=runtime)
    assert await store.record_submit(
        job.slug, token, runtime=runtime, call_id=call_id, lease_s=lease_s, running=False
    )
    return job, token


async def failed(store: Store) -> JobRecord:
    job, token = await claimed(store)
    await store.record_attempt_failure(
        job.slug, token, runtime="local", error_code="BUSY", message="", retryable=True
    )
    await store.fail(job.slug, token, error_code="CHAIN_EXHAUSTED", message="", actor="dispatcher")
    return await store.get_job(job.slug) or job


async def statuses(store: Store, slug: str) -> list[str]:
    return [event.status for event in await store.job_events(slug)]


@pytest.mark.parametrize("stage", ["queued", "dispatching", "running"])
async def test_a_live_job_is_cancelled_with_its_lease_cleared(
    store: Store, clock: ManualClock, stage: str
) -> None:
    job = await create(store)
    if stage != "queued":
        lease = await store.claim_job(job.slug, lease_s=60)
        assert lease is not None
        assert lease.lease_token is not None
        if stage == "running":
            await store.mark_running(job.slug, lease.lease_token, actor="worker:local")
    clock.advance(1)

    cancelled = await store.cancel_job(job.slug, actor="api")

    assert cancelled is not None
    assert ("cancelled", clock.now(), None, None) == (
        cancelled.state,
        cancelled.finished_at,
        cancelled.leased_by,
        cancelled.lease_token,
    )
    assert cancelled == await store.get_job(job.slug)
    event = (await store.job_events(job.slug))[-1]
    assert ("cancelled", "api", {"from": stage}) == (event.status, event.actor, event.detail)


async def test_cancelling_a_submitted_job_names_the_call_to_cancel(store: Store) -> None:
    job, _ = await submitted(store)

    await store.cancel_job(job.slug, actor="admin")

    event = (await store.job_events(job.slug))[-1]
    assert ("cancelled", "home-1", "c-1") == (event.status, event.runtime, event.call_id)


async def test_a_cancelled_job_lease_holder_changes_nothing(store: Store) -> None:
    job, token = await submitted(store)
    await store.cancel_job(job.slug, actor="api")

    late = await store.complete(job.slug, token, result={}, actor="worker:home-1")

    assert not late
    assert "cancelled" == (await store.get_job(job.slug) or job).state


async def test_cancelling_a_finished_job_returns_it_unchanged(store: Store) -> None:
    job, token = await submitted(store)
    await store.complete(job.slug, token, result={"ok": True}, actor="worker:home-1")
    before = await store.get_job(job.slug)
    events = await store.job_events(job.slug)

    again = await store.cancel_job(job.slug, actor="api")

    assert before == again
    assert events == await store.job_events(job.slug)


async def test_cancel_and_retry_of_an_unknown_job_answer_none(store: Store) -> None:
    assert None is await store.cancel_job("job_nope", actor="api")
    assert None is await store.retry_job("job_nope", actor="api")


async def test_a_retry_requeues_a_failed_job_as_a_fresh_drive(
    store: Store, clock: ManualClock
) -> None:
    job = await failed(store)
    clock.advance(1)

    retried = await store.retry_job(job.slug, actor="admin")

    assert retried is not None
    assert ("queued", {}, 0, 0, None, None, None) == (
        retried.state,
        retried.attempts,
        retried.submit_count,
        retried.rescue_count,
        retried.error_code,
        retried.error_message,
        retried.finished_at,
    )
    event = (await store.job_events(job.slug))[-1]
    assert ("retried", "admin", {"previous_error": "CHAIN_EXHAUSTED"}) == (
        event.status,
        event.actor,
        event.detail,
    )
    assert [job.slug] == [j.slug for j in await store.claim_jobs(limit=5, lease_s=60)]


@pytest.mark.parametrize("stage", ["queued", "dispatching", "completed", "cancelled"])
async def test_a_retry_of_a_job_that_did_not_fail_changes_nothing(store: Store, stage: str) -> None:
    job = await create(store)
    if stage != "queued":
        lease = await store.claim_job(job.slug, lease_s=60)
        assert lease is not None
        assert lease.lease_token is not None
        if stage == "completed":
            await store.complete(job.slug, lease.lease_token, result={}, actor="dispatcher")
        if stage == "cancelled":
            await store.cancel_job(job.slug, actor="api")
    before = await store.get_job(job.slug)
    events = await store.job_events(job.slug)

    again = await store.retry_job(job.slug, actor="admin")

    assert before == again
    assert events == await store.job_events(job.slug)


async def test_expired_leases_are_the_leased_jobs_past_their_expiry_longest_expired_first(
    store: Store, clock: ManualClock
) -> None:
    short, _ = await submitted(store, call_id="c-short", lease_s=10)
    long, _ = await submitted(store, call_id="c-long", lease_s=100)
    dispatcher, _ = await claimed(store)  # lease 600 s
    await create(store)  # queued: no lease
    done, done_token = await submitted(store, call_id="c-done", lease_s=5)
    await store.complete(done.slug, done_token, result={}, actor="worker:home-1")

    clock.advance(9.999)
    none_yet = await store.expired_leases()
    clock.advance(0.001)
    first = await store.expired_leases()
    clock.advance(600)
    every = await store.expired_leases()
    capped = await store.expired_leases(limit=2)
    earlier = await store.expired_leases(now=clock.now() - timedelta(seconds=500))

    assert [] == none_yet
    assert [short.slug] == [job.slug for job in first]
    assert [short.slug, long.slug, dispatcher.slug] == [job.slug for job in every]
    assert [short.slug, long.slug] == [job.slug for job in capped]
    assert [short.slug, long.slug] == [job.slug for job in earlier]
    assert all(job.lease_token for job in every)


async def test_a_rescue_requeues_the_job_and_counts_it(store: Store, clock: ManualClock) -> None:
    job, token = await submitted(store)
    clock.advance(61)

    rescued = await store.rescue(job.slug, token, max_rescues=3)

    assert rescued is not None
    assert ("queued", 1, None, None) == (
        rescued.state,
        rescued.rescue_count,
        rescued.leased_by,
        rescued.lease_token,
    )
    event = (await store.job_events(job.slug))[-1]
    assert ("rescued", "reaper", "home-1", "c-1") == (
        event.status,
        event.actor,
        event.runtime,
        event.call_id,
    )
    assert {"rescue_count": 1, "from": "dispatching"} == event.detail
    assert [] == await store.expired_leases()


async def test_rescues_go_up_to_max_rescues_and_then_the_job_fails_with_lease_lost(
    store: Store, clock: ManualClock
) -> None:
    job = await create(store)
    outcomes: list[tuple[str, int]] = []

    for _ in range(3):
        lease = await store.claim_job(job.slug, lease_s=60)
        assert lease is not None
        assert lease.lease_token is not None
        clock.advance(61)
        [expired] = await store.expired_leases()
        rescued = await store.rescue(expired.slug, lease.lease_token, max_rescues=2)
        assert rescued is not None
        outcomes.append((rescued.state, rescued.rescue_count))

    assert [("queued", 1), ("queued", 2), ("failed", 2)] == outcomes
    final = await store.get_job(job.slug)
    assert final is not None
    assert (LEASE_LOST, clock.now(), None) == (
        final.error_code,
        final.finished_at,
        final.lease_token,
    )
    assert ["rescued", "rescued", "failed"] == [
        s for s in await statuses(store, job.slug) if s in {"rescued", "failed"}
    ]
    assert (await store.job_events(job.slug))[-1].error_code == LEASE_LOST


async def test_with_max_rescues_zero_the_first_lost_lease_fails_the_job(store: Store) -> None:
    job, token = await submitted(store)

    rescued = await store.rescue(job.slug, token, max_rescues=0)

    assert rescued is not None
    assert ("failed", LEASE_LOST, 0) == (rescued.state, rescued.error_code, rescued.rescue_count)


async def test_a_lease_lost_job_can_be_retried(store: Store) -> None:
    job, token = await submitted(store)
    await store.rescue(job.slug, token, max_rescues=0)

    retried = await store.retry_job(job.slug, actor="admin")

    assert retried is not None
    assert ("queued", 0) == (retried.state, retried.rescue_count)


async def test_count_leased_counts_a_runtimes_calls_in_flight(store: Store) -> None:
    await submitted(store, "home-1", "c-1")
    running, running_token = await submitted(store, "home-1", "c-2")
    await store.mark_running(running.slug, running_token, actor="worker:home-1")
    await submitted(store, "home-10", "c-3")
    await submitted(store, "modal-beta", "fc-1")
    done, done_token = await submitted(store, "home-1", "c-4")
    await store.complete(done.slug, done_token, result={}, actor="worker:home-1")
    await claimed(store, runner="home-1")  # the dispatcher holds it: no call yet
    await create(store, runner="home-1")

    counts = {rt: await store.count_leased(rt) for rt in ("home-1", "home-10", "modal-beta", "x")}

    assert {"home-1": 2, "home-10": 1, "modal-beta": 1, "x": 0} == counts


async def test_a_released_or_rescued_call_no_longer_counts(store: Store) -> None:
    first, first_token = await submitted(store, "home-1", "c-1")
    second, second_token = await submitted(store, "home-1", "c-2")

    await store.release(first.slug, first_token)
    await store.rescue(second.slug, second_token, max_rescues=3)

    assert 0 == await store.count_leased("home-1")


async def test_queue_depth_counts_the_queued_jobs_of_a_runner(store: Store) -> None:
    for runner in ("local", "local", "home-1"):
        await create(store, runner=runner)
    await claimed(store, runner="local")

    depths = {rt: await store.queue_depth(rt) for rt in ("local", "home-1", "modal-beta")}

    assert {"local": 2, "home-1": 1, "modal-beta": 0} == depths
