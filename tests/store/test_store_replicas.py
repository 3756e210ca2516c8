"""Replicas sharing a store: heartbeats, and a silent replica's dispatcher claims taken back so
the reaper re-queues its jobs within a minute instead of after the 600 s lease (DESIGN §5.3)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpugate.store import NewJob

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from gpugate.clock import ManualClock
    from gpugate.store import Store

LEASE_S = 600


async def test_each_store_names_its_replica_and_its_claims_carry_the_name(
    store: Store, open_another: Callable[[], Awaitable[Store]]
) -> None:
    other = await open_another()
    await store.create_job(NewJob(model="m", input={}, runner="local", slug="j1"))

    (claimed,) = await store.claim_jobs(limit=1, lease_s=LEASE_S)

    assert store.replica != other.replica
    assert ":" not in store.replica
    assert f"j1-dispatcher@{store.replica}" == claimed.leased_by
    assert claimed.call is None  # a claim, not a runtime's call


async def test_a_heartbeat_records_the_replica_and_moves_its_last_seen(
    store: Store, clock: ManualClock
) -> None:
    await store.heartbeat()
    started = clock.now()
    clock.advance(10)
    await store.heartbeat()

    (replica,) = await store.replicas()

    assert (store.replica, started, clock.now()) == (
        replica.id,
        replica.started_at,
        replica.last_seen,
    )


async def test_the_claims_of_a_silent_replica_expire_at_once_and_the_reaper_finds_them(
    store: Store, open_another: Callable[[], Awaitable[Store]], clock: ManualClock
) -> None:
    survivor = await open_another()
    for slug in ("a", "b", "c"):
        await store.create_job(NewJob(model="m", input={}, runner="local", slug=slug))
    mine = await store.claim_jobs(limit=2, lease_s=LEASE_S)  # the replica that will die
    theirs = await survivor.claim_jobs(limit=1, lease_s=LEASE_S)
    await store.heartbeat()
    await survivor.heartbeat()
    clock.advance(20)
    await survivor.heartbeat()

    too_early = await survivor.reclaim_silent(30)
    clock.advance(20)  # the dead replica was last seen 40 s ago
    await survivor.heartbeat()
    reclaimed = await survivor.reclaim_silent(30)
    expired = await survivor.expired_leases()

    assert [] == too_early
    assert [store.replica] == reclaimed
    assert sorted(j.slug for j in mine) == sorted(j.slug for j in expired)
    assert theirs[0].slug not in {j.slug for j in expired}
    assert [] == await survivor.reclaim_silent(30)  # taken back once


async def test_a_replica_never_reclaims_its_own_claims(store: Store, clock: ManualClock) -> None:
    await store.create_job(NewJob(model="m", input={}, runner="local", slug="j1"))
    await store.claim_jobs(limit=1, lease_s=LEASE_S)
    await store.heartbeat()
    clock.advance(300)  # silent for 300 s by its own record, its lease still running

    assert [] == await store.reclaim_silent(30)
    assert [] == await store.expired_leases()


async def test_a_replica_that_stops_puts_its_claims_back_in_the_queue_at_once(
    store: Store, open_another: Callable[[], Awaitable[Store]]
) -> None:
    other = await open_another()
    for slug in ("a", "b", "c"):
        await store.create_job(NewJob(model="m", input={}, runner="local", slug=slug))
    mine = sorted(j.slug for j in await store.claim_jobs(limit=2, lease_s=LEASE_S))
    (theirs,) = await other.claim_jobs(limit=1, lease_s=LEASE_S)

    released = await store.release_replica(store.replica)
    jobs = {slug: await other.get_job(slug) for slug in ("a", "b", "c")}
    last_event = (await other.job_events(mine[0]))[-1]
    claimed_by_other = sorted(j.slug for j in await other.claim_jobs(limit=5, lease_s=LEASE_S))

    assert mine == released
    assert {**dict.fromkeys(mine, ("queued", 0)), theirs.slug: ("dispatching", 0)} == {
        slug: (job.state, job.rescue_count) for slug, job in jobs.items() if job is not None
    }
    assert "released" == last_event.status  # handed back, not rescued
    assert mine == claimed_by_other  # claimable now, not after a lease or a silence
    assert [] == await store.release_replica(store.replica)  # nothing left to hand back
