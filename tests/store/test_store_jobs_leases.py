"""The lease holder's writes: each one fenced by the lease's token."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import pytest

from gpugate.store import JobRecord, NewJob

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from gpugate.clock import ManualClock
    from gpugate.store import JobEvent, Store

    Write = Callable[[Store, str, str], Awaitable[object]]


def new_job(**overrides: Any) -> NewJob:
    values: dict[str, Any] = {"model": "qwen-35b", "input": {"prompt": "hi"}, "runner": "local"}
    values.update(overrides)
    return NewJob(**values)


async def claimed(store: Store, **overrides: Any) -> tuple[JobRecord, str]:
    """A new job, claimed by the dispatcher: the job and its lease token."""
    job, _ = await store.create_job(new_job(**overrides))
    lease = await store.claim_job(job.slug, lease_s=600)
    assert lease is not None
    assert lease.lease_token is not None
    return lease, lease.lease_token


async def submitted(store: Store, *, running: bool = False) -> tuple[JobRecord, str]:
    """A job home-1 accepted as call c-1."""
    job, token = await claimed(store)
    await store.promote_runner(job.slug, token, "home-1")
    assert await store.record_submit(
        job.slug, token, runtime="home-1", call_id="c-1", lease_s=60, running=running
    )
    return job, token


async def snapshot(store: Store, slug: str) -> tuple[JobRecord | None, list[JobEvent]]:
    return await store.get_job(slug), await store.job_events(slug)


async def last_event(store: Store, slug: str) -> JobEvent:
    return (await store.job_events(slug))[-1]


async def test_record_submit_stamps_the_call_counts_the_attempt_and_extends_the_lease(
    store: Store, clock: ManualClock
) -> None:
    job, token = await claimed(store)
    clock.advance(2)

    assert await store.record_submit(
        job.slug, token, runtime="local", call_id="c-9:x", lease_s=30, running=False
    )

    after = await store.get_job(job.slug)
    assert after is not None
    assert ("dispatching", "local:c-9:x", ("local", "c-9:x")) == (
        after.state,
        after.leased_by,
        after.call,
    )
    assert ({"local": 1}, 1, token) == (after.attempts, after.submit_count, after.lease_token)
    assert clock.now() + timedelta(seconds=30) == after.lease_expires_at
    event = await last_event(store, job.slug)
    assert ("submitted", "local", "c-9:x") == (event.status, event.runtime, event.call_id)


async def test_a_serverless_submit_makes_the_job_running(store: Store) -> None:
    job, _ = await submitted(store, running=True)

    assert "running" == (await store.get_job(job.slug) or job).state


async def test_a_submit_after_a_fast_worker_marked_the_job_running_keeps_it_running(
    store: Store,
) -> None:
    job, token = await claimed(store)
    await store.mark_running(job.slug, token, actor="worker:local")

    await store.record_submit(
        job.slug, token, runtime="local", call_id="c-1", lease_s=60, running=False
    )

    assert "running" == (await store.get_job(job.slug) or job).state


async def test_submits_and_failed_attempts_count_per_runtime(store: Store) -> None:
    job, token = await claimed(store)

    for runtime in ("home-1", "home-1", "modal-beta"):
        await store.record_attempt_failure(
            job.slug, token, runtime=runtime, error_code="BUSY", message="429", retryable=True
        )
    await store.record_submit(
        job.slug, token, runtime="modal-beta", call_id="fc-1", lease_s=60, running=True
    )

    after = await store.get_job(job.slug)
    assert after is not None
    assert ({"home-1": 2, "modal-beta": 2}, 1) == (after.attempts, after.submit_count)


async def test_a_failed_attempt_is_an_event_and_the_job_stays_leased(
    store: Store, clock: ManualClock
) -> None:
    job, token = await claimed(store)

    assert await store.record_attempt_failure(
        job.slug,
        token,
        runtime="home-1",
        error_code="UNAUTHORIZED",
        message="401 from worker",
        retryable=False,
    )

    after = await store.get_job(job.slug)
    assert after is not None
    assert ("dispatching", token, job.leased_by) == (
        after.state,
        after.lease_token,
        after.leased_by,
    )
    event = await last_event(store, job.slug)
    assert ("failed", "UNAUTHORIZED", "home-1") == (event.status, event.error_code, event.runtime)
    assert {"retryable": False, "message": "401 from worker"} == event.detail


async def test_promoting_the_runner_walks_it_and_says_so_only_when_it_changes(
    store: Store,
) -> None:
    job, token = await claimed(store)

    assert await store.promote_runner(job.slug, token, "local")
    unchanged = await snapshot(store, job.slug)
    assert await store.promote_runner(job.slug, token, "home-1")

    assert "local" == (unchanged[0] or job).runner
    assert ["queued", "dispatching"] == [e.status for e in unchanged[1]]
    assert "home-1" == (await store.get_job(job.slug) or job).runner
    event = await last_event(store, job.slug)
    assert ("walked", "home-1", {"from": "local"}) == (event.status, event.runtime, event.detail)


async def test_a_release_puts_the_job_back_in_the_queue_without_a_lease(store: Store) -> None:
    job, token = await submitted(store)

    assert await store.release(job.slug, token)

    after = await store.get_job(job.slug)
    assert after is not None
    assert ("queued", None, None, None, None) == (
        after.state,
        after.leased_by,
        after.lease_token,
        after.lease_expires_at,
        after.not_before,
    )
    event = await last_event(store, job.slug)
    assert ("released", "home-1", "c-1") == (event.status, event.runtime, event.call_id)
    assert [after.slug] == [job.slug for job in await store.claim_jobs(limit=5, lease_s=60)]


async def test_a_deferral_keeps_the_job_queued_until_not_before(
    store: Store, clock: ManualClock
) -> None:
    job, token = await claimed(store)
    not_before = clock.now() + timedelta(seconds=30)

    assert await store.release(
        job.slug, token, not_before=not_before, status="deferred", error_code="AT_CAPACITY"
    )

    after = await store.get_job(job.slug)
    assert after is not None
    assert ("queued", not_before) == (after.state, after.not_before)
    event = await last_event(store, job.slug)
    assert ("deferred", "AT_CAPACITY") == (event.status, event.error_code)
    assert {"not_before": not_before.isoformat()} == event.detail
    assert [] == await store.claim_jobs(limit=5, lease_s=60)
    clock.advance(30)
    assert [job.slug] == [job.slug for job in await store.claim_jobs(limit=5, lease_s=60)]


async def test_a_release_status_is_released_or_deferred(store: Store) -> None:
    job, token = await claimed(store)

    with pytest.raises(ValueError, match="deferred"):
        await store.release(job.slug, token, status="walked")


async def test_extending_the_lease_returns_the_new_expiry(store: Store, clock: ManualClock) -> None:
    job, token = await submitted(store)
    clock.advance(50)
    events = await store.job_events(job.slug)

    expires_at = await store.extend_lease(job.slug, token, lease_s=120)

    assert clock.now() + timedelta(seconds=120) == expires_at
    after = await store.get_job(job.slug)
    assert after is not None
    assert (expires_at, clock.now()) == (after.lease_expires_at, after.updated_at)
    assert events == await store.job_events(job.slug)


async def test_a_push_workers_claimed_marks_the_job_running_once(store: Store) -> None:
    job, token = await submitted(store)

    assert await store.mark_running(job.slug, token, actor="worker:home-1")
    assert await store.mark_running(job.slug, token, actor="worker:home-1")

    assert "running" == (await store.get_job(job.slug) or job).state
    statuses = [e.status for e in await store.job_events(job.slug)]
    assert 1 == statuses.count("running")


async def test_progress_is_an_event_by_the_worker_of_the_call(store: Store) -> None:
    job, token = await submitted(store, running=True)

    assert await store.record_progress(job.slug, token, {"pct": 40})

    event = await last_event(store, job.slug)
    assert ("progress", "worker:home-1", "c-1", {"pct": 40}) == (
        event.status,
        event.actor,
        event.call_id,
        event.detail,
    )
    assert "running" == (await store.get_job(job.slug) or job).state


async def test_completion_stores_the_result_and_cost_and_ends_the_lease(
    store: Store, clock: ManualClock
) -> None:
    job, token = await submitted(store, running=True)
    clock.advance(7)
    result = {"choices": [{"message": {"content": "ünïcode"}}], "usage": {"total_tokens": 3}}

    assert await store.complete(
        job.slug, token, result=result, cost_cents=0.25, actor="worker:home-1"
    )

    after = await store.get_job(job.slug)
    assert after is not None
    assert ("completed", result, 0.25, clock.now()) == (
        after.state,
        after.result,
        after.cost_cents,
        after.finished_at,
    )
    assert (None, None, None) == (after.leased_by, after.lease_token, after.lease_expires_at)
    assert after.terminal
    event = await last_event(store, job.slug)
    assert ("completed", "home-1", "c-1") == (event.status, event.runtime, event.call_id)


async def test_completion_may_name_a_result_blob_instead(store: Store) -> None:
    job, token = await submitted(store, running=True)

    await store.complete(
        job.slug, token, result=None, result_ref="r2://results/1.json", actor="reaper"
    )

    after = await store.get_job(job.slug)
    assert after is not None
    assert (None, "r2://results/1.json", None) == (
        after.result,
        after.result_ref,
        after.cost_cents,
    )


async def test_a_terminal_failure_keeps_the_code_and_message_and_ends_the_lease(
    store: Store, clock: ManualClock
) -> None:
    job, token = await claimed(store)

    assert await store.fail(
        job.slug,
        token,
        error_code="EXTERNAL_UPSTREAM_FORBIDDEN",
        message="only external upstreams serve this model",
        actor="dispatcher",
    )

    after = await store.get_job(job.slug)
    assert after is not None
    assert (
        "failed",
        "EXTERNAL_UPSTREAM_FORBIDDEN",
        "only external upstreams serve this model",
        clock.now(),
        None,
    ) == (after.state, after.error_code, after.error_message, after.finished_at, after.lease_token)
    event = await last_event(store, job.slug)
    assert ("failed", "EXTERNAL_UPSTREAM_FORBIDDEN") == (event.status, event.error_code)
    assert {"message": "only external upstreams serve this model", "terminal": True} == (
        event.detail
    )


LATER = datetime(2030, 1, 1, tzinfo=UTC)

FENCED: dict[str, Write] = {
    "promote_runner": lambda s, slug, t: s.promote_runner(slug, t, "modal-beta"),
    "record_submit": lambda s, slug, t: s.record_submit(
        slug, t, runtime="home-1", call_id="c-late", lease_s=60, running=True
    ),
    "record_attempt_failure": lambda s, slug, t: s.record_attempt_failure(
        slug, t, runtime="home-1", error_code="BUSY", message="", retryable=True
    ),
    "release": lambda s, slug, t: s.release(slug, t),
    "defer": lambda s, slug, t: s.release(
        slug, t, not_before=LATER, status="deferred", error_code="GPU_SATURATED"
    ),
    "extend_lease": lambda s, slug, t: s.extend_lease(slug, t, lease_s=999),
    "mark_running": lambda s, slug, t: s.mark_running(slug, t, actor="worker:home-1"),
    "record_progress": lambda s, slug, t: s.record_progress(slug, t, {"pct": 99}),
    "complete": lambda s, slug, t: s.complete(slug, t, result={"late": True}, actor="reaper"),
    "fail": lambda s, slug, t: s.fail(slug, t, error_code="LEASE_LOST", message="", actor="reaper"),
    "rescue": lambda s, slug, t: s.rescue(slug, t, max_rescues=3),
}


@pytest.mark.parametrize("write", FENCED.values(), ids=FENCED.keys())
async def test_a_late_writer_with_the_token_of_an_earlier_lease_changes_nothing(
    store: Store, clock: ManualClock, write: Write
) -> None:
    """The job was released and claimed again: the first lease's holder is a late writer."""
    job, old_token = await claimed(store)
    await store.release(job.slug, old_token)
    current = await store.claim_job(job.slug, lease_s=600)
    assert current is not None
    assert current.lease_token is not None
    await store.record_submit(
        job.slug, current.lease_token, runtime="local", call_id="c-2", lease_s=60, running=False
    )
    before = await snapshot(store, job.slug)
    clock.advance(1)

    outcome = await write(store, job.slug, old_token)

    assert outcome in (False, None)
    assert before == await snapshot(store, job.slug)


@pytest.mark.parametrize("write", FENCED.values(), ids=FENCED.keys())
async def test_the_holder_of_a_finished_jobs_lease_changes_nothing(
    store: Store, clock: ManualClock, write: Write
) -> None:
    job, token = await submitted(store, running=True)
    await store.complete(job.slug, token, result={"ok": True}, actor="worker:home-1")
    before = await snapshot(store, job.slug)
    clock.advance(1)

    outcome = await write(store, job.slug, token)

    assert outcome in (False, None)
    assert before == await snapshot(store, job.slug)


@pytest.mark.parametrize("write", FENCED.values(), ids=FENCED.keys())
async def test_a_made_up_token_or_slug_changes_nothing(
    store: Store, clock: ManualClock, write: Write
) -> None:
    job, _ = await submitted(store)
    before = await snapshot(store, job.slug)
    clock.advance(1)

    outcomes = [await write(store, job.slug, "forged"), await write(store, "job_nope", "forged")]

    assert all(outcome in (False, None) for outcome in outcomes)
    assert before == await snapshot(store, job.slug)


async def test_a_worker_paused_past_its_lease_cannot_complete_after_the_rescue(
    store: Store, clock: ManualClock
) -> None:
    """The lesson's kill test: the paused worker's completion is refused, the new one's kept."""
    job, paused_token = await submitted(store, running=True)
    clock.advance(61)
    [expired] = await store.expired_leases()
    assert expired.lease_token == paused_token
    assert await store.rescue(job.slug, paused_token, max_rescues=3) is not None
    again = await store.claim_job(job.slug, lease_s=600)
    assert again is not None
    assert again.lease_token is not None

    late = await store.complete(job.slug, paused_token, result={"by": "paused"}, actor="reaper")
    fresh = await store.complete(
        job.slug, again.lease_token, result={"by": "fresh"}, actor="dispatcher"
    )

    assert (False, True) == (late, fresh)
    assert {"by": "fresh"} == (await store.get_job(job.slug) or job).result
    statuses = [e.status for e in await store.job_events(job.slug)]
    assert 1 == statuses.count("completed")


async def test_an_expired_lease_not_yet_rescued_still_accepts_its_holders_writes(
    store: Store, clock: ManualClock
) -> None:
    job, token = await submitted(store, running=True)
    clock.advance(3600)

    assert await store.complete(job.slug, token, result={"ok": 1}, actor="worker:home-1")


@pytest.mark.parametrize(
    ("write", "match"),
    [
        (lambda s: s.mark_running("j", "t", actor="worker"), "actor"),
        (lambda s: s.mark_running("j", "t", actor="worker:a:b"), "actor"),
        (lambda s: s.fail("j", "t", error_code="X", message="", actor="robot"), "actor"),
        (lambda s: s.promote_runner("j", "t", "a:b"), "runtime"),
        (
            lambda s: s.record_submit(
                "j", "t", runtime="home-1", call_id="c", lease_s=0, running=False
            ),
            "lease_s",
        ),
        (
            lambda s: s.record_submit(
                "j", "t", runtime="home-1", call_id="", lease_s=1, running=False
            ),
            "call id",
        ),
        (lambda s: s.extend_lease("j", "t", lease_s=-5), "lease_s"),
        (lambda s: s.rescue("j", "t", max_rescues=-1), "max_rescues"),
        (
            lambda s: s.release("j", "t", not_before=datetime(2030, 1, 1)),  # noqa: DTZ001
            "timezone-aware",
        ),
        (lambda s: s.count_leased("home-1:c-1"), "runtime"),
    ],
)
async def test_arguments_no_caller_should_pass_are_refused_before_the_store_is_touched(
    store: Store, write: Callable[[Store], Awaitable[object]], match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        await write(store)
