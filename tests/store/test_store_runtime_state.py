"""Runtime operator states, their audit trail, a runtime's last submit, and the audit filters."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING

import pytest

from gpugate.store import AuditEvent, NewJob
from gpugate.store.runtime_state import LastSubmit, RuntimeState

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from gpugate.clock import ManualClock
    from gpugate.store import Store


async def test_a_runtime_without_a_stored_state_is_absent_meaning_enabled(store: Store) -> None:
    assert {} == await store.runtime_states()


async def test_setting_a_state_stores_it_with_reason_actor_and_since(
    store: Store, clock: ManualClock
) -> None:
    clock.advance(5)

    stored = await store.set_runtime_state("home-1", "disabled", "401 on submit", "gateway")

    expected = RuntimeState("home-1", "disabled", "401 on submit", "gateway", clock.now())
    assert expected == stored
    assert {"home-1": expected} == await store.runtime_states()


async def test_each_change_appends_its_audit_event_with_the_previous_state(store: Store) -> None:
    await store.set_runtime_state("home-1", "drained", "maintenance", "alice")
    await store.set_runtime_state("home-1", "enabled", "back", "bob")

    events = await store.list_audit(subject="runtime:home-1")

    assert [
        ("bob", "runtime.enabled", {"state": "enabled", "previous": "drained", "reason": "back"}),
        (
            "alice",
            "runtime.drained",
            {"state": "drained", "previous": "enabled", "reason": "maintenance"},
        ),
    ] == [(e.actor, e.action, e.detail) for e in events]


async def test_setting_the_same_state_again_keeps_since_but_records_the_new_reason(
    store: Store, clock: ManualClock
) -> None:
    first = await store.set_runtime_state("home-1", "disabled", "first", "alice")
    clock.advance(60)

    again = await store.set_runtime_state("home-1", "disabled", "second", "gateway")

    assert (first.since, "second", "gateway") == (again.since, again.reason, again.actor)
    assert len(await store.list_audit(subject="runtime:home-1")) == 2


async def test_a_new_state_moves_since(store: Store, clock: ManualClock) -> None:
    await store.set_runtime_state("home-1", "disabled", "", "alice")
    clock.advance(60)

    enabled = await store.set_runtime_state("home-1", "enabled", "", "alice")

    assert clock.now() == enabled.since


async def test_an_unknown_state_is_refused_and_changes_nothing(store: Store) -> None:
    with pytest.raises(ValueError, match="invalid runtime state 'paused'"):
        await store.set_runtime_state("home-1", "paused", "", "alice")

    assert {} == await store.runtime_states()
    assert [] == await store.list_audit()


async def test_states_of_several_runtimes_are_kept_apart(store: Store) -> None:
    await store.set_runtime_state("home-1", "disabled", "a", "alice")
    await store.set_runtime_state("modal-beta", "drained", "b", "alice")

    states = await store.runtime_states()

    assert {"home-1": "disabled", "modal-beta": "drained"} == {
        runtime: s.state for runtime, s in states.items()
    }


async def test_another_process_sees_a_state_change(
    store: Store, open_another: Callable[[], Awaitable[Store]]
) -> None:
    other = await open_another()
    await store.set_runtime_state("home-1", "drained", "x", "alice")

    assert "drained" == (await other.runtime_states())["home-1"].state


async def submitted_job(store: Store, runtime: str, call_id: str) -> tuple[str, str]:
    job, _ = await store.create_job(NewJob(model="m", input={}, runner=runtime))
    lease = await store.claim_job(job.slug, lease_s=600)
    assert lease is not None
    assert lease.lease_token is not None
    assert await store.record_submit(
        job.slug, lease.lease_token, runtime=runtime, call_id=call_id, lease_s=60, running=False
    )
    return job.slug, lease.lease_token


async def test_a_runtime_that_never_had_a_submit_has_no_last_submit(store: Store) -> None:
    assert await store.last_submit("home-1") is None


async def test_last_submit_is_the_newest_submit_and_what_became_of_it(
    store: Store, clock: ManualClock
) -> None:
    await submitted_job(store, "home-1", "c-1")
    clock.advance(1)
    submitted_at = clock.now()
    slug, token = await submitted_job(store, "home-1", "c-2")
    await submitted_job(store, "other", "c-3")

    pending = await store.last_submit("home-1")
    clock.advance(2)
    assert await store.complete(slug, token, result={"ok": True}, actor="worker:home-1")
    done = await store.last_submit("home-1")

    assert LastSubmit(submitted_at, slug, "c-2", "submitted", None, submitted_at) == pending
    assert LastSubmit(submitted_at, slug, "c-2", "completed", None, clock.now()) == done


async def test_audit_is_filtered_by_actor(store: Store) -> None:
    await store.append_audit(AuditEvent("alice", "runtime.disabled", "runtime:home-1"))
    bob = await store.append_audit(AuditEvent("bob", "runtime.disabled", "runtime:home-1"))

    assert [bob] == await store.list_audit(actor="bob")


async def test_audit_since_keeps_events_at_or_after_that_time(
    store: Store, clock: ManualClock
) -> None:
    await store.append_audit(AuditEvent("alice", "config.saved", "config"))
    clock.advance(10)
    later = await store.append_audit(AuditEvent("alice", "config.saved", "config"))

    assert [later] == await store.list_audit(since=clock.now())
    assert len(await store.list_audit(since=clock.now() - timedelta(seconds=11))) == 2
