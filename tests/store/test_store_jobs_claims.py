"""Claims: the dispatcher's sweep and the event-driven claim of one job."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import pytest

from gpugate.store import JobRecord, NewJob

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from gpugate.clock import ManualClock
    from gpugate.store import Store


def new_job(**overrides: Any) -> NewJob:
    values: dict[str, Any] = {"model": "qwen-35b", "input": {"prompt": "hi"}, "runner": "local"}
    values.update(overrides)
    return NewJob(**values)


async def create(store: Store, **overrides: Any) -> JobRecord:
    job, _ = await store.create_job(new_job(**overrides))
    return job


async def test_a_claim_leases_queued_jobs_oldest_first_up_to_the_limit(
    store: Store, clock: ManualClock
) -> None:
    jobs = [await create(store) for _ in range(5)]
    clock.advance(3)

    claimed = await store.claim_jobs(limit=3, lease_s=600)

    assert [job.slug for job in jobs[:3]] == [job.slug for job in claimed]
    for job in claimed:
        assert "dispatching" == job.state
        assert f"{job.slug}-dispatcher@{store.replica}" == job.leased_by
        assert clock.now() + timedelta(seconds=600) == job.lease_expires_at
        assert clock.now() == job.updated_at
        assert job.call is None
        assert job == await store.get_job(job.slug)
    assert ["queued", "queued"] == [
        job.state for job in (await store.list_jobs(state="queued")).jobs
    ]


async def test_every_claimed_job_gets_its_own_fresh_token(store: Store) -> None:
    for _ in range(4):
        await create(store)

    claimed = await store.claim_jobs(limit=10, lease_s=60)

    tokens = [job.lease_token for job in claimed]
    assert 4 == len(set(tokens))
    assert all(token and len(token) >= 20 for token in tokens)


async def test_a_claim_appends_a_dispatching_event_by_the_dispatcher(
    store: Store, clock: ManualClock
) -> None:
    job = await create(store, runner="home-1")
    clock.advance(1)

    await store.claim_jobs(limit=1, lease_s=60)

    [queued, dispatching] = await store.job_events(job.slug)
    assert ("queued", "dispatching") == (queued.status, dispatching.status)
    assert ("dispatcher", "home-1", None, clock.now(), {}) == (
        dispatching.actor,
        dispatching.runtime,
        dispatching.call_id,
        dispatching.at,
        dispatching.detail,
    )


async def test_claimed_jobs_are_not_claimed_again_while_leased(store: Store) -> None:
    await create(store)
    await store.claim_jobs(limit=10, lease_s=60)

    assert [] == await store.claim_jobs(limit=10, lease_s=60)


async def test_an_expired_dispatcher_lease_is_not_claimed_again_but_left_to_the_reaper(
    store: Store, clock: ManualClock
) -> None:
    await create(store)
    await store.claim_jobs(limit=10, lease_s=60)
    clock.advance(61)

    assert [] == await store.claim_jobs(limit=10, lease_s=60)
    assert 1 == len(await store.expired_leases())


async def test_a_job_is_not_claimed_before_its_not_before(store: Store, clock: ManualClock) -> None:
    later = await create(store, not_before=clock.now() + timedelta(seconds=30))
    now = await create(store)

    first = await store.claim_jobs(limit=10, lease_s=60)
    clock.advance(29.999)
    early = await store.claim_jobs(limit=10, lease_s=60)
    clock.advance(0.001)
    due = await store.claim_jobs(limit=10, lease_s=60)

    assert [now.slug] == [job.slug for job in first]
    assert [] == early
    assert [later.slug] == [job.slug for job in due]


async def test_the_claim_time_may_be_given(store: Store, clock: ManualClock) -> None:
    await create(store, not_before=clock.now() + timedelta(seconds=30))
    at = clock.now() + timedelta(seconds=30)

    [job] = await store.claim_jobs(limit=1, lease_s=10, now=at)

    assert at + timedelta(seconds=10) == job.lease_expires_at


async def test_a_claim_that_looks_ahead_for_due_jobs_is_stamped_with_the_time_it_happened(
    store: Store, clock: ManualClock
) -> None:
    """Issue 14 defect 11: a claim that takes jobs due a little later (a slot freed) leases
    them from now and dates their ``dispatching`` event now, never in the future."""
    job = await create(store, not_before=clock.now() + timedelta(seconds=5))
    clock.advance(1)

    [claimed] = await store.claim_jobs(
        limit=1, lease_s=60, due_by=clock.now() + timedelta(seconds=5)
    )

    [_, dispatching] = await store.job_events(job.slug)
    assert (clock.now(), clock.now() + timedelta(seconds=60), clock.now()) == (
        dispatching.at,
        claimed.lease_expires_at,
        claimed.updated_at,
    )


async def test_a_claim_does_not_look_ahead_unless_asked(store: Store, clock: ManualClock) -> None:
    await create(store, not_before=clock.now() + timedelta(seconds=5))

    early = await store.claim_jobs(limit=1, lease_s=60)
    ahead = await store.claim_jobs(
        limit=1, lease_s=60, due_by=clock.now() + timedelta(seconds=4.999)
    )

    assert ([], []) == (early, ahead)


async def test_finished_and_leased_jobs_are_never_claimed(store: Store) -> None:
    for _ in range(3):
        await create(store)
    first, second, third = await store.claim_jobs(limit=3, lease_s=60)
    assert first.lease_token is not None
    assert second.lease_token is not None
    await store.complete(first.slug, first.lease_token, result={}, actor="dispatcher")
    await store.fail(
        second.slug, second.lease_token, error_code="CHAIN_EXHAUSTED", message="", actor="admin"
    )
    await store.cancel_job(third.slug, actor="api")

    assert [] == await store.claim_jobs(limit=10, lease_s=60)


async def test_a_released_job_is_claimed_again_with_a_new_token(store: Store) -> None:
    job = await create(store)
    [first] = await store.claim_jobs(limit=1, lease_s=60)
    assert first.lease_token is not None
    await store.release(job.slug, first.lease_token)

    [second] = await store.claim_jobs(limit=1, lease_s=60)

    assert job.slug == second.slug
    assert first.lease_token != second.lease_token


async def test_claim_job_claims_one_job_and_answers_none_when_it_is_not_claimable(
    store: Store, clock: ManualClock
) -> None:
    first = await create(store)
    second = await create(store)
    deferred = await create(store, not_before=clock.now() + timedelta(seconds=5))

    claimed = await store.claim_job(second.slug, lease_s=60)

    assert claimed is not None
    assert (second.slug, "dispatching") == (claimed.slug, claimed.state)
    assert None is await store.claim_job(second.slug, lease_s=60)
    assert None is await store.claim_job(deferred.slug, lease_s=60)
    assert None is await store.claim_job("job_unknown", lease_s=60)
    assert "queued" == (await store.get_job(first.slug) or first).state


async def test_a_lease_must_be_positive_and_the_limit_at_least_one(store: Store) -> None:
    job = await create(store)

    with pytest.raises(ValueError, match="lease_s"):
        await store.claim_jobs(limit=1, lease_s=0)
    with pytest.raises(ValueError, match="lease_s"):
        await store.claim_job(job.slug, lease_s=-1)
    with pytest.raises(ValueError, match="limit"):
        await store.claim_jobs(limit=0, lease_s=60)
    assert "queued" == (await store.get_job(job.slug) or job).state


async def test_concurrent_claimers_on_two_stores_never_get_the_same_job(
    store: Store, open_another: Callable[[], Awaitable[Store]]
) -> None:
    """Two stores are two replicas (PostgreSQL) or two processes on one file (SQLite)."""
    other = await open_another()
    slugs = {(await create(store)).slug for _ in range(60)}

    async def drain(claimer: Store) -> list[str]:
        got: list[str] = []
        while batch := await claimer.claim_jobs(limit=3, lease_s=60):
            got += [job.slug for job in batch]
            await asyncio.sleep(0)
        return got

    hauls = await asyncio.gather(drain(store), drain(other), drain(store), drain(other))

    claimed = [slug for haul in hauls for slug in haul]
    assert slugs == set(claimed)
    assert len(slugs) == len(claimed)
    assert [] == (await store.list_jobs(state="queued")).jobs
    for slug in slugs:
        assert ["queued", "dispatching"] == [e.status for e in await store.job_events(slug)]


async def test_concurrent_claims_of_one_job_from_two_stores_succeed_once(
    store: Store, open_another: Callable[[], Awaitable[Store]]
) -> None:
    other = await open_another()
    job = await create(store)

    outcomes = await asyncio.gather(
        *((store, other)[n % 2].claim_job(job.slug, lease_s=60) for n in range(10))
    )

    assert 1 == len([claimed for claimed in outcomes if claimed is not None])
    assert ["queued", "dispatching"] == [e.status for e in await store.job_events(job.slug)]


async def test_a_sweep_and_a_claim_of_one_job_racing_hand_it_out_once(
    store: Store, open_another: Callable[[], Awaitable[Store]]
) -> None:
    other = await open_another()
    jobs = [await create(store) for _ in range(10)]

    results = await asyncio.gather(
        store.claim_jobs(limit=10, lease_s=60),
        *(other.claim_job(job.slug, lease_s=60) for job in jobs),
    )

    swept: list[JobRecord] = results[0]
    singles = [job for job in results[1:] if isinstance(job, JobRecord)]
    claimed = [job.slug for job in swept] + [job.slug for job in singles]
    assert sorted(job.slug for job in jobs) == sorted(claimed)
