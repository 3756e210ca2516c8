from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import TYPE_CHECKING

from gpugate.store import InFlight, Mismatch, Replay, Started, request_fingerprint

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from gpugate.clock import ManualClock
    from gpugate.store import Store

BODY = b'{"model": "qwen-35b", "messages": []}'
FINGERPRINT = request_fingerprint("POST", "/v1/chat/completions", BODY)
OTHER_FINGERPRINT = request_fingerprint("POST", "/v1/chat/completions", BODY + b" ")
HEADERS = [("content-type", "application/json"), ("x-gateway-upstream", "qwen-35b")]
RESPONSE = b'{"id": "chatcmpl-1"}\x00\xff'


async def begin(store: Store, owner: str = "owner-a", fingerprint: str = FINGERPRINT) -> object:
    return await store.idem_begin("key-1", fingerprint, ttl_s=60, owner=owner)


async def complete(store: Store, owner: str = "owner-a") -> bool:
    return await store.idem_complete("key-1", owner, 200, HEADERS, RESPONSE)


def test_the_fingerprint_covers_method_path_and_body() -> None:
    base = request_fingerprint("POST", "/v1/embeddings", b"{}")

    assert base == request_fingerprint("post", "/v1/embeddings", b"{}")
    assert 64 == len(base)
    others = {
        request_fingerprint("PUT", "/v1/embeddings", b"{}"),
        request_fingerprint("POST", "/v1/completions", b"{}"),
        request_fingerprint("POST", "/v1/embeddings", b"{ }"),
    }
    assert base not in others
    assert 3 == len(others)


async def test_the_first_begin_starts_and_a_second_sees_it_in_flight(store: Store) -> None:
    assert Started() == await begin(store)
    assert InFlight() == await begin(store, owner="owner-b")


async def test_a_completed_key_replays_the_stored_response_byte_for_byte(
    store: Store, clock: ManualClock
) -> None:
    started_at = clock.now()
    await begin(store)
    clock.advance(2)

    assert await complete(store)
    outcome = await begin(store, owner="owner-b")

    assert isinstance(outcome, Replay)
    record = outcome.record
    assert ("key-1", FINGERPRINT, 200) == (record.key, record.fingerprint, record.status)
    assert tuple(HEADERS) == record.headers
    assert RESPONSE == record.body
    assert (started_at, started_at + timedelta(seconds=60)) == (
        record.created_at,
        record.expires_at,
    )


async def test_an_empty_response_body_replays_as_empty(store: Store) -> None:
    await begin(store)

    assert await store.idem_complete("key-1", "owner-a", 204, [], b"")
    outcome = await begin(store, owner="owner-b")

    assert isinstance(outcome, Replay)
    assert (204, (), b"") == (outcome.record.status, outcome.record.headers, outcome.record.body)


async def test_the_same_key_with_another_body_is_a_mismatch_in_flight_and_completed(
    store: Store,
) -> None:
    await begin(store)
    in_flight = await begin(store, owner="owner-b", fingerprint=OTHER_FINGERPRINT)
    await complete(store)
    completed = await begin(store, owner="owner-b", fingerprint=OTHER_FINGERPRINT)

    assert Mismatch() == in_flight
    assert Mismatch() == completed


async def test_only_the_owner_can_complete_and_only_once(store: Store) -> None:
    await begin(store)

    by_other = await complete(store, owner="owner-b")
    still = await begin(store, owner="owner-c")
    by_owner = await complete(store)
    again = await complete(store)

    assert (False, True, False) == (by_other, by_owner, again)
    assert InFlight() == still


async def test_completing_an_unknown_key_changes_nothing(store: Store) -> None:
    assert not await complete(store)
    assert Started() == await begin(store)


async def test_an_abandoned_key_can_be_started_again(store: Store) -> None:
    await begin(store)

    abandoned = await store.idem_abandon("key-1", "owner-a")

    assert abandoned
    assert Started() == await begin(store, owner="owner-b")


async def test_only_the_owner_can_abandon_and_a_completed_key_stays(store: Store) -> None:
    await begin(store)
    by_other = await store.idem_abandon("key-1", "owner-b")
    in_flight = await begin(store, owner="owner-c")
    await complete(store)
    after_completion = await store.idem_abandon("key-1", "owner-a")

    assert (False, False) == (by_other, after_completion)
    assert InFlight() == in_flight
    assert isinstance(await begin(store, owner="owner-c"), Replay)


async def test_an_expired_key_counts_as_absent_and_its_old_owner_cannot_complete_it(
    store: Store, clock: ManualClock
) -> None:
    await store.idem_begin("key-1", FINGERPRINT, ttl_s=10, owner="owner-a")
    clock.advance(9.999)
    before = await begin(store, owner="owner-b", fingerprint=OTHER_FINGERPRINT)
    clock.advance(0.001)

    after = await begin(store, owner="owner-b", fingerprint=OTHER_FINGERPRINT)

    assert (Mismatch(), Started()) == (before, after)
    assert not await complete(store, owner="owner-a")
    assert await complete(store, owner="owner-b")


async def test_an_expired_response_is_not_replayed(store: Store, clock: ManualClock) -> None:
    await begin(store)
    await complete(store)
    clock.advance(60)

    assert Started() == await begin(store, owner="owner-b")


async def test_completion_may_keep_the_response_longer_than_the_claim(
    store: Store, clock: ManualClock
) -> None:
    await store.idem_begin("key-1", FINGERPRINT, ttl_s=10, owner="owner-a")
    await store.idem_complete("key-1", "owner-a", 200, HEADERS, RESPONSE, ttl_s=3600)
    clock.advance(3599)

    outcome = await begin(store, owner="owner-b")

    assert isinstance(outcome, Replay)
    assert clock.now() + timedelta(seconds=1) == outcome.record.expires_at


async def test_purge_deletes_exactly_the_expired_keys(store: Store, clock: ManualClock) -> None:
    for key, ttl_s in [("short-1", 5), ("short-2", 5), ("long", 100)]:
        await store.idem_begin(key, FINGERPRINT, ttl_s=ttl_s, owner="owner-a")
    await store.idem_complete("short-2", "owner-a", 200, HEADERS, RESPONSE)
    clock.advance(10)

    purged = await store.idem_purge_expired()

    assert 2 == purged
    assert 0 == await store.idem_purge_expired()
    assert InFlight() == await store.idem_begin("long", FINGERPRINT, ttl_s=5, owner="owner-b")


async def test_many_concurrent_begins_from_two_stores_start_the_key_exactly_once(
    store: Store, open_another: Callable[[], Awaitable[Store]]
) -> None:
    other = await open_another()

    outcomes = await asyncio.gather(
        *(
            (store, other)[n % 2].idem_begin("key-1", FINGERPRINT, ttl_s=60, owner=f"o-{n}")
            for n in range(10)
        )
    )

    assert [InFlight()] * 9 + [Started()] == sorted(outcomes, key=lambda o: isinstance(o, Started))


async def test_a_replay_is_read_without_claiming_the_key(store: Store, clock: ManualClock) -> None:
    """``idem_replay`` says what ``idem_begin`` would replay and claims nothing: nothing for
    an unknown key, one in flight, another request's or an expired one."""
    assert None is await store.idem_replay("key-1", FINGERPRINT)
    await begin(store)
    assert None is await store.idem_replay("key-1", FINGERPRINT)  # in flight
    assert await complete(store)

    found = await store.idem_replay("key-1", FINGERPRINT)
    assert isinstance(found, Replay)
    assert (200, tuple(HEADERS), RESPONSE) == (
        found.record.status,
        found.record.headers,
        found.record.body,
    )
    assert None is await store.idem_replay("key-1", OTHER_FINGERPRINT)
    assert found == await begin(store, owner="owner-b")  # still kept, as begin sees it
    clock.advance(61)
    assert None is await store.idem_replay("key-1", FINGERPRINT)
    assert Started() == await begin(store, owner="owner-c")
