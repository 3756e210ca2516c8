"""The spend ledger and call slots: reservations that hold under concurrency, on every backend."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from gpugate.core.budget import Cost
from gpugate.core.lease import RESERVED_CALL
from gpugate.store import NewJob
from gpugate.store.ledger import SOFT_CAP_ACTION, SpendDay

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from gpugate.clock import ManualClock
    from gpugate.store import JobRecord, Store

ROOM_FOR_TEN = Cost(estimate_cents=1.2, limit_cents=12.0, cents_per_second=0.02)


async def claimed(store: Store, count: int, prefix: str = "j") -> list[JobRecord]:
    for i in range(count):
        await store.create_job(NewJob(model="m", input={}, runner="rt", slug=f"{prefix}{i}"))
    jobs = await store.claim_jobs(limit=count, lease_s=600)
    assert count == len(jobs)
    return jobs


async def submitted(store: Store, job: JobRecord, call_id: str, runtime: str = "rt") -> None:
    assert job.lease_token is not None
    assert await store.record_submit(
        job.slug, job.lease_token, runtime=runtime, call_id=call_id, lease_s=60, running=True
    )


def token(job: JobRecord) -> str:
    assert job.lease_token is not None
    return job.lease_token


async def test_fifty_concurrent_reservations_with_room_for_ten_reserve_exactly_ten(
    store: Store, open_another: Callable[[], Awaitable[Store]], clock: ManualClock
) -> None:
    """Half of them go through a second store on the same database, as a second replica."""
    other = await open_another()
    jobs = await claimed(store, 50)

    answers = await asyncio.gather(
        *(
            (store if i % 2 else other).reserve_call(
                job.slug, token(job), "rt", max_concurrency=None, cost=ROOM_FOR_TEN
            )
            for i, job in enumerate(jobs)
        )
    )

    assert {"reserved": 10, "over_budget": 40} == {a: answers.count(a) for a in set(answers)}
    assert 10 == len(await store.ledger_entries("rt", limit=100))
    days = await store.spend_days(clock.now().date())
    assert [round(d.cents, 6) for d in days["rt"]] == [12.0]


async def test_fifty_concurrent_slot_takes_with_max_concurrency_ten_take_exactly_ten(
    store: Store, open_another: Callable[[], Awaitable[Store]]
) -> None:
    other = await open_another()
    jobs = await claimed(store, 50)

    answers = await asyncio.gather(
        *(
            (store if i % 2 else other).reserve_call(
                job.slug, token(job), "rt", max_concurrency=10, cost=None
            )
            for i, job in enumerate(jobs)
        )
    )

    assert {"reserved": 10, "at_capacity": 40} == {a: answers.count(a) for a in set(answers)}
    assert 10 == await store.count_leased("rt")


async def test_a_taken_slot_marks_the_job_and_the_recorded_call_keeps_it(store: Store) -> None:
    (job,) = await claimed(store, 1)

    assert "reserved" == await store.reserve_call(
        job.slug, token(job), "rt", max_concurrency=1, cost=None
    )
    held = await store.get_job(job.slug)
    assert held is not None
    assert f"rt:{RESERVED_CALL}" == held.leased_by
    await submitted(store, job, "c1")

    assert 1 == await store.count_leased("rt")


async def test_a_slot_frees_when_the_call_ends(store: Store) -> None:
    first, second = await claimed(store, 2)
    await store.reserve_call(first.slug, token(first), "rt", max_concurrency=1, cost=None)
    await submitted(store, first, "c1")
    assert "at_capacity" == await store.reserve_call(
        second.slug, token(second), "rt", max_concurrency=1, cost=None
    )

    await store.complete(first.slug, token(first), result={}, actor="reaper")

    assert "reserved" == await store.reserve_call(
        second.slug, token(second), "rt", max_concurrency=1, cost=None
    )


async def test_an_over_budget_reservation_takes_no_slot(store: Store) -> None:
    first, second = await claimed(store, 2)
    tiny = Cost(estimate_cents=5, limit_cents=1, cents_per_second=0.1)
    await store.reserve_call(first.slug, token(first), "rt", max_concurrency=None, cost=tiny)

    assert "over_budget" == await store.reserve_call(
        second.slug, token(second), "rt", max_concurrency=2, cost=tiny
    )

    held = await store.get_job(second.slug)
    assert held is not None
    assert f"{second.slug}-dispatcher@{store.replica}" == held.leased_by
    assert [first.slug] == [entry.slug for entry in await store.ledger_entries("rt")]


async def test_a_reservation_is_admitted_while_todays_spend_is_below_the_limit_not_its_estimate(
    store: Store, clock: ManualClock
) -> None:
    """The audit's budget: daily_cents 1 (over at 2), an estimate of 1.2 cents (0.02 x 60 s).
    Each reservation is admitted while the spend before it is below 2, so a day overshoots by
    at most one estimate, and a runtime whose limit is below one estimate still runs."""
    jobs = await claimed(store, 3)
    one_call = Cost(estimate_cents=1.2, limit_cents=2.0, cents_per_second=0.02)

    answers = [
        await store.reserve_call(job.slug, token(job), "rt", max_concurrency=None, cost=one_call)
        for job in jobs
    ]

    assert ["reserved", "reserved", "over_budget"] == answers
    days = await store.spend_days(clock.now().date())
    assert [2.4] == [round(d.cents, 6) for d in days["rt"]]


async def test_fifty_concurrent_reservations_overshoot_the_limit_by_at_most_one_estimate(
    store: Store, open_another: Callable[[], Awaitable[Store]], clock: ManualClock
) -> None:
    """Estimates of 5 against a limit of 12 on two stores at once: 0, 5 and 10 are below 12,
    so exactly three are admitted (15 cents: one estimate past the limit, never more)."""
    other = await open_another()
    jobs = await claimed(store, 50)
    coarse = Cost(estimate_cents=5.0, limit_cents=12.0, cents_per_second=0.1)

    answers = await asyncio.gather(
        *(
            (store if i % 2 else other).reserve_call(
                job.slug, token(job), "rt", max_concurrency=None, cost=coarse
            )
            for i, job in enumerate(jobs)
        )
    )

    assert {"reserved": 3, "over_budget": 47} == {a: answers.count(a) for a in set(answers)}
    days = await store.spend_days(clock.now().date())
    assert [15.0] == [d.cents for d in days["rt"]]


async def test_a_budget_of_zero_admits_nothing(store: Store) -> None:
    (job,) = await claimed(store, 1)
    nothing = Cost(estimate_cents=1.0, limit_cents=0.0, cents_per_second=0.1)

    assert "over_budget" == await store.reserve_call(
        job.slug, token(job), "rt", max_concurrency=None, cost=nothing
    )
    assert [] == await store.ledger_entries("rt")


async def test_a_stale_token_reserves_nothing(store: Store) -> None:
    (job,) = await claimed(store, 1)

    assert "stale" == await store.reserve_call(
        job.slug, "forged", "rt", max_concurrency=1, cost=ROOM_FOR_TEN
    )

    assert [] == await store.ledger_entries("rt")


async def test_a_failed_submit_gives_back_the_slot_and_releases_the_reservation(
    store: Store, clock: ManualClock
) -> None:
    (job,) = await claimed(store, 1)
    await store.reserve_call(job.slug, token(job), "rt", max_concurrency=1, cost=ROOM_FOR_TEN)

    await store.release_call(job.slug, token(job), "rt")

    held = await store.get_job(job.slug)
    assert held is not None
    assert f"{job.slug}-dispatcher@{store.replica}" == held.leased_by
    (entry,) = await store.ledger_entries("rt")
    assert ("released", 0.0) == (entry.state, entry.cents)
    assert [0.0] == [d.cents for d in (await store.spend_days(clock.now().date()))["rt"]]


async def test_a_completed_call_is_settled_at_its_reported_cost(
    store: Store, clock: ManualClock
) -> None:
    (job,) = await claimed(store, 1)
    await store.reserve_call(job.slug, token(job), "rt", max_concurrency=None, cost=ROOM_FOR_TEN)
    await submitted(store, job, "c1")
    assert 0 == await store.settle_ledger()  # still running: the estimate stays

    await store.complete(job.slug, token(job), result={}, cost_cents=3.5, actor="reaper")

    assert 1 == await store.settle_ledger()
    (entry,) = await store.ledger_entries("rt")
    assert ("settled", "reported", 3.5, "c1") == (
        entry.state,
        entry.source,
        entry.cents,
        entry.call_id,
    )
    assert [3.5] == [d.cents for d in (await store.spend_days(clock.now().date()))["rt"]]


async def test_a_completed_call_without_a_cost_is_settled_at_duration_times_rate(
    store: Store, clock: ManualClock
) -> None:
    (job,) = await claimed(store, 1)
    await store.reserve_call(job.slug, token(job), "rt", max_concurrency=None, cost=ROOM_FOR_TEN)
    await submitted(store, job, "c1")
    clock.advance(100)

    await store.complete(job.slug, token(job), result={}, actor="reaper")
    await store.settle_ledger()

    (entry,) = await store.ledger_entries("rt")
    assert ("settled", "estimated") == (entry.state, entry.source)
    assert 2.0 == round(entry.cents, 6)  # 100 s x 0.02 cents/s


async def test_a_lost_call_is_released_at_zero(store: Store) -> None:
    (job,) = await claimed(store, 1)
    await store.reserve_call(job.slug, token(job), "rt", max_concurrency=None, cost=ROOM_FOR_TEN)
    await submitted(store, job, "c1")

    await store.rescue(job.slug, token(job), max_rescues=3)
    await store.settle_ledger()

    (entry,) = await store.ledger_entries("rt")
    assert ("released", 0.0, "c1") == (entry.state, entry.cents, entry.call_id)


async def test_spend_days_lists_each_runtime_per_day_oldest_first(
    store: Store, clock: ManualClock
) -> None:
    first, second = await claimed(store, 2)
    day_one = clock.now().date()
    await store.reserve_call(
        first.slug, token(first), "rt", max_concurrency=None, cost=ROOM_FOR_TEN
    )
    clock.advance(86_400)
    await store.reserve_call(
        second.slug, token(second), "rt", max_concurrency=None, cost=ROOM_FOR_TEN
    )

    days = await store.spend_days(day_one)

    assert {"rt": [SpendDay(day_one, 1.2), SpendDay(clock.now().date(), 1.2)]} == days


async def test_the_soft_cap_is_marked_and_audited_once_per_runtime_and_day(
    store: Store, clock: ManualClock
) -> None:
    jobs = await claimed(store, 6)
    for job in jobs:
        await store.reserve_call(
            job.slug, token(job), "rt", max_concurrency=None, cost=ROOM_FOR_TEN
        )
    today = clock.now().date()

    assert not await store.mark_soft_cap("rt", today, daily_cents=100)
    marks = await asyncio.gather(
        *(store.mark_soft_cap("rt", today, daily_cents=6) for _ in range(5))
    )

    assert [True] == [m for m in marks if m]
    (event,) = await store.list_audit(action=SOFT_CAP_ACTION)
    assert ("gateway", "runtime:rt") == (event.actor, event.subject)
