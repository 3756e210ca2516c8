"""The key counters in the store (both backends): a reservation checks every limit and takes
its share in one step, so concurrent reservations never take more than the limit; settling
replaces the estimate with what was used, releasing gives it all back."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest

from gpugate.clock import ManualClock
from gpugate.core.keys import ClientKey, Limits
from gpugate.core.limits import Estimate, windows
from gpugate.store import Store
from gpugate.store.factory import open_store

NOW = datetime(2026, 12, 1, 13, 0, 30, tzinfo=UTC)
SPANS = windows(NOW)
EST = Estimate(prompt_tokens=10, completion_tokens=90, cents=0.5)


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


async def test_concurrent_reservations_take_exactly_the_requests_per_minute(store: Store) -> None:
    limits = Limits(requests_per_min=20)
    codes = await asyncio.gather(
        *(store.reserve_quota("key_1", limits, EST, SPANS) for _ in range(50))
    )
    assert 20 == codes.count(None)
    assert {"RATE_LIMITED"} == set(codes) - {None}


async def test_the_tokens_per_minute_count_the_estimate_until_it_is_settled(store: Store) -> None:
    limits = Limits(tokens_per_min=250)
    assert await store.reserve_quota("key_1", limits, EST, SPANS) is None
    assert await store.reserve_quota("key_1", limits, EST, SPANS) is None
    assert "TOKEN_LIMITED" == await store.reserve_quota("key_1", limits, EST, SPANS)
    await store.settle_quota("key_1", SPANS, EST, tokens=20, cents=0.1, requests=1)
    # 100 (the open estimate) + 20 (used) + 100 (this one) <= 250
    assert await store.reserve_quota("key_1", limits, EST, SPANS) is None


async def test_a_released_reservation_gives_back_its_request_tokens_and_slot(store: Store) -> None:
    limits = Limits(requests_per_min=1, concurrency=1, daily_tokens=100)
    assert await store.reserve_quota("key_1", limits, EST, SPANS) is None
    assert "CONCURRENCY_LIMITED" == await store.reserve_quota("key_1", limits, EST, SPANS)
    await store.settle_quota("key_1", SPANS, EST, tokens=0, cents=0.0, requests=0)
    assert await store.reserve_quota("key_1", limits, EST, SPANS) is None


async def test_the_daily_budget_counts_cents_across_minutes(store: Store) -> None:
    limits = Limits(daily_cents=1.0)
    assert await store.reserve_quota("key_1", limits, EST, SPANS) is None
    await store.settle_quota("key_1", SPANS, EST, tokens=100, cents=0.6, requests=1)
    later = windows(NOW.replace(minute=30))
    assert "BUDGET_EXCEEDED" == await store.reserve_quota("key_1", limits, EST, later)
    next_day = windows(NOW.replace(day=2))
    assert await store.reserve_quota("key_1", limits, EST, next_day) is None


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
    limits = Limits(requests_per_min=10)
    assert await store.reserve_quota("key_1", limits, EST, SPANS) is None
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
    assert again.leased
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
