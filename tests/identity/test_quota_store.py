"""The key counters in the store (both backends) and the quota over them: a lease checks every
limit and takes its share in one step, so concurrent leases never take more than the limit;
concurrency slots stay held until given back; a reservation from the lease is settled with
what was used, or given back."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from gpugate.clock import ManualClock
from gpugate.core.keys import ClientKey, Limits
from gpugate.core.limits import windows
from gpugate.store import Store
from gpugate.store.factory import open_store
from harness import eventually

NOW = datetime(2026, 12, 1, 13, 0, 30, tzinfo=UTC)
SPANS = windows(NOW)


@pytest.fixture
async def store(dsn: str) -> AsyncIterator[Store]:
    opened = open_store(dsn, clock=ManualClock(start=NOW))
    await opened.open()
    await opened.migrate()
    await opened.heartbeat()
    await opened.create_key(
        ClientKey(id="key_1", name="k", tenant="t", prefix="gk-abcdefgh"), "d1", actor="test"
    )
    try:
        yield opened
    finally:
        await opened.close()


async def test_concurrency_slots_are_held_until_given_back_and_count_for_every_live_replica(
    store: Store, dsn: str
) -> None:
    from gpugate.core.limits import Slice

    limits = Limits(concurrency=3)
    assert 2 == (await store.lease_quota("key_1", limits, Slice(slots=2), SPANS)).slots
    later = windows(NOW.replace(minute=30))  # slots are not a window's: still held
    assert 1 == (await store.lease_quota("key_1", limits, Slice(slots=2), later)).slots
    other = open_store(dsn, clock=ManualClock(start=NOW))
    await other.open()
    await other.heartbeat()
    try:
        assert 0 == (await other.lease_quota("key_1", limits, Slice(slots=1), SPANS)).slots
        await store.return_slots("key_1", 2)
        assert 2 == (await other.lease_quota("key_1", limits, Slice(slots=3), SPANS)).slots
    finally:
        await other.close()


async def test_the_daily_budget_counts_cents_across_minutes(store: Store) -> None:
    from gpugate.core.limits import Slice

    limits = Limits(daily_cents=1.0)
    assert 0.6 == (await store.lease_quota("key_1", limits, Slice(day_cents=0.6), SPANS)).day_cents
    later = windows(NOW.replace(minute=30))
    got = await store.lease_quota("key_1", limits, Slice(day_cents=0.6), later)
    assert got.day_cents == pytest.approx(0.4)
    next_day = windows(NOW.replace(day=2))
    assert (
        0.6 == (await store.lease_quota("key_1", limits, Slice(day_cents=0.6), next_day)).day_cents
    )


async def test_usage_rows_add_up_per_day_key_model_and_upstream(store: Store) -> None:
    from gpugate.store.keys import UsageRow

    row = UsageRow(NOW.date(), "key_1", "t", "m", "u", 1, 10, 20, 0.5)
    await store.add_usage([row, row])
    await store.add_usage([row])
    (found,) = await store.list_usage(tenant="t")
    assert (3, 30, 60, 1.5) == (
        found.requests,
        found.prompt_tokens,
        found.completion_tokens,
        found.cents,
    )
    assert [] == await store.list_usage(tenant="other")


async def test_concurrent_leases_never_hand_out_more_than_the_limit(store: Store) -> None:
    from gpugate.core.limits import Slice

    limits = Limits(requests_per_min=100, tokens_per_min=1000, daily_cents=3.0)
    want = Slice(requests=30, tokens=300, day_cents=1.0)
    grants = await asyncio.gather(
        *(store.lease_quota("key_1", limits, want, SPANS) for _ in range(10))
    )
    assert 100 == sum(g.requests or 0 for g in grants)
    assert 1000 == sum(g.tokens or 0 for g in grants)
    assert 3.0 == pytest.approx(sum(g.day_cents or 0 for g in grants))
    assert all(g.day_tokens is None for g in grants)  # no such limit: nothing leased


async def test_old_minute_and_day_counters_are_purged_and_current_ones_kept(store: Store) -> None:
    from gpugate.core.limits import Slice

    limits = Limits(requests_per_min=10, daily_tokens=100)
    await store.lease_quota("key_1", limits, Slice(requests=1, day_tokens=10), SPANS)
    assert 0 == await store.purge_counters(NOW - timedelta(seconds=1))
    assert 2 == await store.purge_counters(NOW + timedelta(seconds=1))  # its minute and day


async def test_owner_rows_of_things_no_longer_stored_are_purged(store: Store) -> None:
    from gpugate.store import NewJob

    job, _ = await store.create_job(NewJob(model="m", input={}, runner="local", slug="j-1"))
    assert await store.own("job", job.slug, "t")
    assert await store.own("job", "j-gone", "t")
    assert await store.own("file", "file-gone", "t")
    assert 2 == await store.purge_orphan_owners()
    assert "t" == await store.owner("job", "j-1")
    assert await store.owner("job", "j-gone") is None


async def test_a_part_without_a_limit_never_refuses_even_past_what_a_lease_holds_of_it(
    store: Store,
) -> None:
    """A lease holds UNLIMITED of a count the key has no limit on; a request estimated above
    that (a body of 4 GiB, were it allowed) is still admitted, and the next one too: the
    part is topped up, never judged."""
    from gpugate.core.keys import Principal
    from gpugate.metrics import Metrics
    from gpugate.services.limits import UNLIMITED, Quota

    clock = ManualClock(start=NOW)
    quota = Quota(store, clock, Metrics(), lambda _model: None)
    key = ClientKey(
        id="key_1", name="k", tenant="t", prefix="gk-abcdefgh",
        limits=Limits(requests_per_min=100),
    )  # fmt: skip
    principal = Principal(key)
    huge = await quota.reserve(principal, "m", {}, 8 * UNLIMITED)
    assert huge is not None
    assert huge.tokens > UNLIMITED
    again = await quota.reserve(principal, "m", {"max_tokens": 10}, 40)
    assert again is not None
    quota.settle_local(huge, 10, 10)
    quota.settle_local(again, 10, 10)
    spans = quota._current_windows()
    assert await quota.reserve(principal, "m", {}, 8 * UNLIMITED) is not None
    assert spans is quota._current_windows()  # all in one minute


async def test_a_new_minute_s_lease_keeps_the_day_s_budget_and_is_full_where_there_is_no_limit(
    store: Store,
) -> None:
    """At a new minute the minute parts start again from the store while the day's tokens
    leased and not used carry over; a part without a limit starts full (UNLIMITED), however
    far the old minute ran it down."""
    from gpugate.core.keys import Principal
    from gpugate.metrics import Metrics
    from gpugate.services.limits import DAY_SLICE, UNLIMITED, Quota

    clock = ManualClock(start=NOW)
    quota = Quota(store, clock, Metrics(), lambda _model: None)
    key = ClientKey(
        id="key_1", name="k", tenant="t", prefix="gk-abcdefgh",
        limits=Limits(requests_per_min=100, daily_tokens=1_000_000),
    )  # fmt: skip
    principal = Principal(key)
    first = await quota.reserve(principal, "m", {"max_tokens": 10}, 40)  # 20 tokens
    assert first is not None
    lease = quota._leases["key_1"]
    lease.tokens = 3  # as if the minute had run its unlimited part down
    day_left = lease.day_tokens
    clock.advance(60)
    nxt = await quota.reserve(principal, "m", {"max_tokens": 10}, 40)
    assert nxt is not None
    renewed = quota._leases["key_1"]
    assert renewed is not lease
    assert renewed.tokens == UNLIMITED - nxt.tokens  # no tpm limit: full again, less this one
    # the day's slice carried over, and a new one leased with the minute's parts
    assert renewed.day_tokens == day_left + 1_000_000 // DAY_SLICE - nxt.tokens
    assert renewed.requests < 100 // 20 + 1  # the minute's requests leased anew


class _Counted:
    """The real store, its lease transactions counted."""

    def __init__(self, store: Store) -> None:
        self.store, self.leases, self.returns = store, 0, 0

    def __getattr__(self, name: str) -> object:
        return getattr(self.store, name)

    async def lease_quota(self, *args: object) -> object:
        self.leases += 1
        return await self.store.lease_quota(*args)  # type: ignore[arg-type]

    async def return_slots(self, *args: object) -> None:
        self.returns += 1
        await self.store.return_slots(*args)  # type: ignore[arg-type]


@pytest.fixture
async def replicas(store: Store, dsn: str) -> AsyncIterator[tuple[Any, Any]]:
    """Two replicas' quotas on one store (a second, live replica on the same database)."""
    clock = ManualClock(start=NOW)
    other = open_store(dsn, clock=clock)
    await other.open()
    await other.heartbeat()  # a live replica: its slots count
    try:
        yield _quota(store, clock), _quota(other, clock)
    finally:
        await other.close()


def _quota(store: object, clock: ManualClock) -> object:
    from gpugate.metrics import Metrics
    from gpugate.services.limits import Quota

    return Quota(store, clock, Metrics(), lambda _model: None)  # type: ignore[arg-type]


def _principal(concurrency: int) -> object:
    from gpugate.core.keys import Principal

    return Principal(
        ClientKey(
            id="key_1",
            name="k",
            tenant="t",
            prefix="gk-abcdefgh",
            limits=Limits(concurrency=concurrency),
        )
    )


async def test_two_replicas_lease_concurrency_slots_within_the_limit_and_give_them_back_idle(
    replicas: tuple[Any, Any],
) -> None:
    from gpugate.errors import ConcurrencyLimited

    (a, b), principal = replicas, _principal(40)
    held_a = [await a.reserve(principal, "m", {}, 40) for _ in range(30)]
    held_b = [await b.reserve(principal, "m", {}, 40) for _ in range(10)]
    with pytest.raises(ConcurrencyLimited):
        await a.reserve(principal, "m", {}, 40)
    with pytest.raises(ConcurrencyLimited):
        await b.reserve(principal, "m", {}, 40)
    for held in held_a:  # A goes idle: its slots go back at the next sweep (within a second)
        await a.settle(held, 1, 1)
    await a.sweep()
    more_b = [await b.reserve(principal, "m", {}, 40) for _ in range(30)]
    with pytest.raises(ConcurrencyLimited):
        await b.reserve(principal, "m", {}, 40)
    for held in held_b + more_b:
        await b.release(held)
    await b.sweep()
    again_a = [await a.reserve(principal, "m", {}, 40) for _ in range(40)]
    assert len(again_a) == 40


async def test_a_key_busy_on_one_replica_takes_no_transaction_per_request(store: Store) -> None:
    """Concurrency 100: a replica gives back nothing while the key has requests in flight, so
    requests that come and go with ten in flight lease twice in all; when the last one ends,
    nothing goes back on the request path (a burst's end, under load), and all of it at the
    next sweep."""
    clock = ManualClock(start=NOW)
    counted = _Counted(store)
    quota, principal = _quota(counted, clock), _principal(100)
    flight = [await quota.reserve(principal, "m", {}, 40) for _ in range(10)]
    for _ in range(200):  # one ends, one starts
        await quota.settle(flight.pop(0), 1, 1)
        flight.append(await quota.reserve(principal, "m", {}, 40))
    assert counted.leases <= 3
    assert counted.returns == 0
    for held in flight:
        await quota.settle(held, 1, 1)
    assert counted.returns == 0
    lease = quota._leases["key_1"]
    assert (lease.slots, lease.inflight) == (10, 0)  # every slot it leased, free
    await quota.sweep()
    assert counted.returns == 1  # idle at the sweep: all of them in one transaction
    assert (lease.slots, lease.inflight) == (0, 0)


async def test_a_key_with_one_slot_is_exact_between_replicas_request_by_request(
    replicas: tuple[Any, Any],
) -> None:
    from gpugate.errors import ConcurrencyLimited

    (a, b), principal = replicas, _principal(1)
    for _ in range(3):
        held = await a.reserve(principal, "m", {}, 40)
        with pytest.raises(ConcurrencyLimited):
            await b.reserve(principal, "m", {}, 40)
        await a.settle(held, 1, 1)  # the one slot goes back at the request's end
        held = await b.reserve(principal, "m", {}, 40)
        with pytest.raises(ConcurrencyLimited):
            await a.reserve(principal, "m", {}, 40)
        await b.release(held)


async def test_the_quota_loop_gives_back_an_idle_key_s_last_slots_within_a_second(
    store: Store,
) -> None:
    from gpugate.services.limits import IDLE_SLOTS_S

    clock = ManualClock(start=NOW)
    counted = _Counted(store)
    quota, principal = _quota(counted, clock), _principal(100)
    held = await quota.reserve(principal, "m", {}, 40)  # 5 slots leased, 1 taken
    await quota.settle(held, 1, 1)
    assert counted.returns == 0  # idle, holding its 5 until the sweep
    loop = asyncio.create_task(quota.run())
    try:
        await eventually(lambda: bool(clock._sleepers), what="the loop asleep on the clock")
        clock.advance(IDLE_SLOTS_S)
        await eventually(lambda: counted.returns == 1, what="the idle key's slots given back")
        assert quota._leases["key_1"].slots == 0
    finally:
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)


async def test_a_sweep_trims_a_busy_key_s_free_slots_to_what_it_keeps(store: Store) -> None:
    """A burst leased 20 slots; with 5 still in flight, the sweep gives back all but 5 of the
    15 free (1/20 of the limit), so another replica gets them within a second."""
    clock = ManualClock(start=NOW)
    counted = _Counted(store)
    quota, principal = _quota(counted, clock), _principal(100)
    burst = [await quota.reserve(principal, "m", {}, 40) for _ in range(20)]
    for held in burst[5:]:
        await quota.settle(held, 1, 1)
    assert counted.returns == 0  # busy: nothing given back on the request path
    lease = quota._leases["key_1"]
    assert (lease.slots, lease.inflight) == (15, 5)
    await quota.sweep()
    assert (lease.slots, lease.inflight, counted.returns) == (5, 5, 1)
