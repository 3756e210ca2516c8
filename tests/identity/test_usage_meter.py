"""The usage meter (both backends): a keyed answer adds to in-memory sums, a flush prices them at
the model's price, writes them to the store and adds them to ``gateway_tokens_total`` once each,
whatever the store says, and a day's answers count in that day."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from test_quota_store import store  # the store fixture, both backends

from gpugate.clock import ManualClock
from gpugate.config.loader import parse_config
from gpugate.core.keys import ClientKey, Principal
from gpugate.errors import StoreUnavailable
from gpugate.metrics import Metrics
from gpugate.services.usage import UsageMeter
from gpugate.store import Store
from gpugate.store.keys import UsageRow

__all__ = ["store"]

CONFIG = parse_config(
    "listen: 127.0.0.1:1\nstore: 'sqlite:///unused.db'\nupstreams:\n"
    "  - {id: u, url: 'http://127.0.0.1:9', models: [m, free]}\n"
    "models:\n  - {name: m, price: {prompt_per_1k_cents: 10, completion_per_1k_cents: 20}}\n"
)
KEY = Principal(ClientKey(id="key_1", name="k", tenant="t", prefix="gk-abcdefgh"))


class Outage:
    """The store, but for ``add_usage`` failing while ``down``."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.down = False

    async def add_usage(self, rows: list[UsageRow]) -> None:
        if self.down:
            raise StoreUnavailable("the store is down")
        await self.store.add_usage(rows)


def _meter(store: object, clock: ManualClock, metrics: Metrics) -> UsageMeter:
    return UsageMeter(store, clock, metrics, lambda: CONFIG)  # type: ignore[arg-type]


def _tokens(metrics: Metrics, kind: str) -> float:
    return (
        metrics.registry.get_sample_value(
            "gateway_tokens_total", {"tenant": "t", "model": "m", "kind": kind}
        )
        or 0.0
    )


async def test_a_failed_flush_keeps_the_counts_for_the_next_and_meters_them_once(
    store: Store,
) -> None:
    clock, metrics = ManualClock(start=datetime(2026, 12, 1, 13, 0, tzinfo=UTC)), Metrics()
    outage = Outage(store)
    meter = _meter(outage, clock, metrics)
    meter.record(KEY, "m", "u", 10, 20)
    outage.down = True
    assert 0 == await meter.flush()
    meter.record(KEY, "m", "u", 1, 2)
    outage.down = False
    assert 1 == await meter.flush()
    assert 0 == await meter.flush()  # nothing left
    (row,) = await store.list_usage(key_id="key_1")
    assert (2, 11, 22) == (row.requests, row.prompt_tokens, row.completion_tokens)
    assert row.cents == pytest.approx((11 * 10 + 22 * 20) / 1000)  # each flush priced its own
    assert (11.0, 22.0) == (_tokens(metrics, "prompt"), _tokens(metrics, "completion"))


async def test_answers_on_either_side_of_midnight_count_in_their_own_day(store: Store) -> None:
    clock = ManualClock(start=datetime(2026, 12, 1, 23, 59, 59, 500_000, tzinfo=UTC))
    meter = _meter(store, clock, Metrics())
    meter.record(KEY, "m", "u", 1, 1)
    clock.advance(0.4)  # 23:59:59.9
    meter.record(KEY, "m", "u", 2, 2)
    clock.advance(0.2)  # 00:00:00.1
    meter.record(KEY, "m", "u", 4, 4)
    await meter.flush()
    days = {row.day.isoformat(): row.prompt_tokens for row in await store.list_usage(tenant="t")}
    assert {"2026-12-01": 3, "2026-12-02": 4} == days


async def test_a_flush_prices_each_sum_at_its_model_s_price_and_an_unpriced_model_costs_nothing(
    store: Store,
) -> None:
    meter = _meter(store, ManualClock(start=datetime(2026, 12, 1, 13, 0, tzinfo=UTC)), Metrics())
    for _ in range(3):
        meter.record(KEY, "m", "u", 100, 50)
    meter.record(KEY, "free", "u", 100, 50)
    assert 2 == await meter.flush()
    cents = {row.model: row.cents for row in await store.list_usage(key_id="key_1")}
    assert cents["m"] == pytest.approx(3 * (100 * 10 + 50 * 20) / 1000)
    assert 0.0 == cents["free"]
