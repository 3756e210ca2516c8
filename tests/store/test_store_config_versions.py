from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from gpugate.store import CONFIG_SAVED, CONFIG_SEEDED, ConfigVersion

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from gpugate.clock import ManualClock
    from gpugate.store import Store


def config_document(**overrides: Any) -> dict[str, Any]:
    document: dict[str, Any] = {
        "upstreams": [{"id": "qwen-35b", "url": "http://127.0.0.1:8001", "models": ["qwen-35b"]}],
        "fallback_chain": ["local"],
    }
    document.update(overrides)
    return document


async def test_an_empty_store_has_no_current_config(store: Store) -> None:
    assert None is await store.current_config()
    assert [] == await store.list_configs()


async def test_saves_are_numbered_from_one_and_the_newest_is_current(store: Store) -> None:
    first = await store.save_config(config_document(), actor="alice", note="first")
    second = await store.save_config(config_document(default_runtime="x"), actor="bob", note="")

    assert (1, 2) == (first.version, second.version)
    assert second == await store.current_config()


async def test_a_save_records_the_clock_time_the_actor_and_the_note(
    store: Store, clock: ManualClock
) -> None:
    clock.advance(90.5)

    saved = await store.save_config(config_document(), actor="alice", note="add upstream")

    expected = ConfigVersion(1, config_document(), clock.now(), "alice", "add upstream")
    assert expected == saved
    assert UTC == saved.created_at.tzinfo


async def test_get_config_returns_a_saved_version_and_none_for_an_unknown_one(
    store: Store,
) -> None:
    first = await store.save_config(config_document(), actor="alice", note="one")
    await store.save_config(config_document(listen="127.0.0.1:9000"), actor="alice", note="two")

    assert first == await store.get_config(1)
    assert None is await store.get_config(3)


async def test_list_configs_is_newest_first_and_honours_the_limit(store: Store) -> None:
    for n in range(5):
        await store.save_config(config_document(listen=f"127.0.0.1:{9000 + n}"), actor="a", note="")

    assert [5, 4, 3, 2, 1] == [c.version for c in await store.list_configs()]
    assert [5, 4] == [c.version for c in await store.list_configs(limit=2)]


async def test_a_document_round_trips_unchanged(store: Store) -> None:
    document = config_document(
        note="naïve ✓ 日本", ratio=0.25, big=2**40, flag=True, nothing=None, nested={"a": [[], {}]}
    )

    await store.save_config(document, actor="alice", note="")

    current = await store.current_config()
    assert current is not None
    assert document == current.document


async def test_a_save_writes_its_config_saved_audit_event(store: Store, clock: ManualClock) -> None:
    await store.save_config(config_document(), actor="alice", note="first")
    await store.save_config(config_document(), actor="bob", note="second")

    events = await store.list_audit(action=CONFIG_SAVED)

    expected = [
        ("bob", "config", {"version": 2, "note": "second"}, clock.now()),
        ("alice", "config", {"version": 1, "note": "first"}, clock.now()),
    ]
    assert expected == [(e.actor, e.subject, e.detail, e.at) for e in events]


async def test_twenty_concurrent_saves_from_two_stores_get_versions_one_to_twenty(
    store: Store, open_another: Callable[[], Awaitable[Store]]
) -> None:
    other = await open_another()
    saves = [
        (store, other)[n % 2].save_config(config_document(n=n), actor=f"saver-{n}", note="")
        for n in range(20)
    ]

    saved = await asyncio.gather(*saves)

    assert list(range(1, 21)) == sorted(s.version for s in saved)
    assert list(range(20, 0, -1)) == [c.version for c in await store.list_configs()]
    audited = await store.list_audit(action=CONFIG_SAVED)
    assert list(range(20, 0, -1)) == [e.detail["version"] for e in audited]
    by_version = {c.version: c.actor for c in await store.list_configs()}
    assert by_version == {e.detail["version"]: e.actor for e in audited}


async def test_seed_stores_version_one_on_an_empty_store_and_audits_it(store: Store) -> None:
    current, seeded = await store.seed_config(config_document(), actor="gpugate.yaml")

    assert (1, True) == (current.version, seeded)
    assert config_document() == current.document
    events = await store.list_audit(action=CONFIG_SEEDED)
    assert [("gpugate.yaml", {"version": 1})] == [(e.actor, e.detail) for e in events]


async def test_seed_changes_nothing_once_a_version_exists(store: Store) -> None:
    saved = await store.save_config(config_document(), actor="alice", note="")
    await store.save_config(config_document(listen="127.0.0.1:1"), actor="alice", note="")

    current, seeded = await store.seed_config(config_document(other=1), actor="gpugate.yaml")

    assert (2, False) == (current.version, seeded)
    assert [saved] == (await store.list_configs())[1:]
    assert [] == await store.list_audit(action=CONFIG_SEEDED)


async def test_two_stores_seeding_at_once_store_exactly_one_version(
    store: Store, open_another: Callable[[], Awaitable[Store]]
) -> None:
    other = await open_another()

    results = await asyncio.gather(
        store.seed_config(config_document(by="first"), actor="first"),
        other.seed_config(config_document(by="second"), actor="second"),
    )

    assert [False, True] == sorted(seeded for _, seeded in results)
    assert results[0][0] == results[1][0]
    assert [1] == [c.version for c in await store.list_configs()]


async def test_times_are_returned_timezone_aware_in_utc(store: Store, clock: ManualClock) -> None:
    clock.advance(3600 * 30 + 0.000123)

    saved = await store.save_config(config_document(), actor="a", note="")

    assert datetime(2026, 1, 2, 6, 0, 0, 123, tzinfo=UTC) == saved.created_at
    assert saved == await store.get_config(1)
