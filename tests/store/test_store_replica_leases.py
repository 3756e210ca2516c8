"""A silent replica's leases are taken back within DESIGN §5.3's minute, every kind it held: not
only its dispatcher claims (tests/store/test_store_replicas.py) but the call slot a claim had
reserved just before its submit, and a call that ran in its own process (an ``upstream``
runtime's) — before session 15 those waited for their own lease: the claim's 600 s for a slot,
``jobs.quiet_s`` (60 s) plus a reaper pass for a call. A push worker's call is not the
replica's and is left to its own lease."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpugate.store import NewJob

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from gpugate.clock import ManualClock
    from gpugate.store import JobRecord, Store

CLAIM_S = 600
CALL_S = 60


async def submitted(store: Store, job: JobRecord, runtime: str, *, in_process: bool) -> None:
    """Record ``runtime``'s acceptance of the claimed ``job`` (an upstream call: in process)."""
    assert await store.record_submit(
        job.slug,
        str(job.lease_token),
        runtime=runtime,
        call_id=f"call-{job.slug}",
        lease_s=CALL_S,
        running=in_process,
        in_process=in_process,
    )


async def test_a_silent_replicas_reserved_slots_and_in_process_calls_are_taken_back(
    store: Store, open_another: Callable[[], Awaitable[Store]], clock: ManualClock
) -> None:
    survivor = await open_another()
    for slug in ("in-process", "reserved", "pushed"):
        await store.create_job(NewJob(model="m", input={}, runner="local", slug=slug))
    held = {job.slug: job for job in await store.claim_jobs(limit=3, lease_s=CLAIM_S)}
    await submitted(store, held["in-process"], "local", in_process=True)
    token = str(held["reserved"].lease_token)
    await store.reserve_call("reserved", token, "local", max_concurrency=8, cost=None)
    await submitted(store, held["pushed"], "home-1", in_process=False)
    await store.heartbeat()
    await survivor.heartbeat()
    clock.advance(40)  # the replica died 40 s ago; no lease of its own has run out yet
    await survivor.heartbeat()

    reclaimed = await survivor.reclaim_silent(30)
    expired = sorted(job.slug for job in await survivor.expired_leases())

    assert [store.replica] == reclaimed
    assert ["in-process", "reserved"] == expired
    assert [] == await survivor.reclaim_silent(30)


async def test_a_call_recorded_in_process_names_the_replica_and_another_does_not(
    store: Store,
) -> None:
    for slug in ("in-process", "pushed"):
        await store.create_job(NewJob(model="m", input={}, runner="local", slug=slug))
    held = {job.slug: job for job in await store.claim_jobs(limit=2, lease_s=CLAIM_S)}
    await submitted(store, held["in-process"], "local", in_process=True)
    await submitted(store, held["pushed"], "home-1", in_process=False)
    recorded = {slug: await store.get_job(slug) for slug in held}

    assert {"in-process": store.replica, "pushed": None} == {
        slug: job.lease_replica for slug, job in recorded.items() if job is not None
    }
    assert {"in-process": "local:call-in-process", "pushed": "home-1:call-pushed"} == {
        slug: job.leased_by for slug, job in recorded.items() if job is not None
    }


async def test_a_silent_replicas_reserved_slot_is_taken_back_with_its_claims(
    store: Store, open_another: Callable[[], Awaitable[Store]], clock: ManualClock
) -> None:
    """The slot a dispatcher reserved just before its submit (the push call's POST may take
    seconds): before, a replica killed there left the job leased for the claim's 600 s."""
    survivor = await open_another()
    await store.create_job(NewJob(model="m", input={}, runner="local", slug="reserved"))
    (claimed,) = await store.claim_jobs(limit=1, lease_s=CLAIM_S)
    await store.reserve_call(
        "reserved", str(claimed.lease_token), "home-1", max_concurrency=2, cost=None
    )
    await store.heartbeat()
    clock.advance(40)
    await survivor.heartbeat()

    assert [store.replica] == await survivor.reclaim_silent(30)
    assert ["reserved"] == [job.slug for job in await survivor.expired_leases()]
