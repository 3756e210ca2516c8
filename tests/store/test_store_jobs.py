"""Jobs in the store: creation (idempotent), reading, listing, and the event trail."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import pytest

from gpugate.errors import BadRequest
from gpugate.store import JobRecord, NewJob

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from gpugate.clock import ManualClock
    from gpugate.store import Store

INPUT = {"messages": [{"role": "user", "content": "grüß dich"}], "max_tokens": 16}


def new_job(**overrides: Any) -> NewJob:
    values: dict[str, Any] = {"model": "qwen-35b", "input": INPUT, "runner": "local"}
    values.update(overrides)
    return NewJob(**values)


async def create(store: Store, **overrides: Any) -> JobRecord:
    job, created = await store.create_job(new_job(**overrides))
    assert created
    return job


async def statuses(store: Store, slug: str) -> list[str]:
    return [event.status for event in await store.job_events(slug)]


async def test_a_new_job_is_queued_with_a_generated_slug_and_the_clock_time(
    store: Store, clock: ManualClock
) -> None:
    clock.advance(5)

    job, created = await store.create_job(new_job())

    assert created
    assert job.slug.startswith("job_")
    assert 24 == len(job.slug)
    expected = JobRecord(
        id=job.id,
        slug=job.slug,
        idempotency_key=None,
        model="qwen-35b",
        job_class="batch",
        operation="chat/completions",
        input=INPUT,
        input_ref=None,
        runner="local",
        state="queued",
        attempts={},
        submit_count=0,
        rescue_count=0,
        leased_by=None,
        lease_token=None,
        lease_expires_at=None,
        not_before=None,
        allow_external=True,
        result=None,
        result_ref=None,
        error_code=None,
        error_message=None,
        cost_cents=None,
        created_at=clock.now(),
        updated_at=clock.now(),
        finished_at=None,
    )
    assert expected == job
    assert job == await store.get_job(job.slug)
    assert UTC == job.created_at.tzinfo


async def test_every_given_field_round_trips(store: Store, clock: ManualClock) -> None:
    not_before = clock.now() + timedelta(minutes=5, microseconds=7)

    job = await create(
        store,
        slug="report-2026.01_a",
        idempotency_key="key-1",
        job_class="interactive",
        operation="embeddings",
        input={"input": ["a", "b"], "nested": {"ratio": 0.5, "ok": True, "none": None}},
        input_ref="s3://bucket/inputs/1.json",
        runner="home-1",
        allow_external=False,
        not_before=not_before,
    )

    stored = await store.get_job("report-2026.01_a")
    assert job == stored
    assert ("report-2026.01_a", "key-1", "interactive", "embeddings") == (
        job.slug,
        job.idempotency_key,
        job.job_class,
        job.operation,
    )
    assert {"input": ["a", "b"], "nested": {"ratio": 0.5, "ok": True, "none": None}} == job.input
    assert ("s3://bucket/inputs/1.json", "home-1", False) == (
        job.input_ref,
        job.runner,
        job.allow_external,
    )
    assert not_before == job.not_before


async def test_creation_appends_a_queued_event_by_the_api_for_the_runner(
    store: Store, clock: ManualClock
) -> None:
    job = await create(store, runner="home-1")

    [event] = await store.job_events(job.slug)

    assert (job.slug, clock.now(), "queued", "api", "home-1", None, None, {}) == (
        event.slug,
        event.at,
        event.status,
        event.actor,
        event.runtime,
        event.call_id,
        event.error_code,
        event.detail,
    )


async def test_twenty_concurrent_creates_with_one_idempotency_key_make_exactly_one_job(
    store: Store,
) -> None:
    outcomes = await asyncio.gather(
        *(store.create_job(new_job(idempotency_key="key-1", input={"n": n})) for n in range(20))
    )

    [created_job] = [job for job, created in outcomes if created]
    assert [created_job] * 20 == [job for job, _ in outcomes]
    assert [created_job] == (await store.list_jobs()).jobs
    assert ["queued"] == await statuses(store, created_job.slug)


async def test_twenty_concurrent_creates_from_two_stores_with_one_key_make_exactly_one_job(
    store: Store, open_another: Callable[[], Awaitable[Store]]
) -> None:
    """Two stores on one database race as two replicas (PostgreSQL) or processes (SQLite) do."""
    other = await open_another()

    outcomes = await asyncio.gather(
        *(
            (store, other)[n % 2].create_job(new_job(idempotency_key="key-1", input={"n": n}))
            for n in range(20)
        )
    )

    [created_job] = [job for job, created in outcomes if created]
    assert [created_job] * 20 == [job for job, _ in outcomes]
    assert [created_job] == (await other.list_jobs()).jobs
    assert ["queued"] == await statuses(store, created_job.slug)


async def test_the_same_key_returns_the_existing_job_whatever_its_state(store: Store) -> None:
    first = await create(store, idempotency_key="key-1")
    [claimed] = await store.claim_jobs(limit=1, lease_s=60)
    assert claimed.lease_token is not None
    await store.fail(
        first.slug, claimed.lease_token, error_code="CHAIN_EXHAUSTED", message="", actor="admin"
    )

    again, created = await store.create_job(new_job(idempotency_key="key-1", model="other"))

    assert not created
    assert (first.slug, "failed", "qwen-35b") == (again.slug, again.state, again.model)
    assert 1 == len((await store.list_jobs()).jobs)


async def test_creates_without_a_key_make_distinct_jobs(store: Store) -> None:
    jobs = await asyncio.gather(*(store.create_job(new_job()) for _ in range(5)))

    assert [True] * 5 == [created for _, created in jobs]
    assert 5 == len({job.slug for job, _ in jobs})
    assert 5 == len({job.id for job, _ in jobs})


async def test_different_keys_make_different_jobs(store: Store) -> None:
    first = await create(store, idempotency_key="key-1")
    second = await create(store, idempotency_key="key-2")

    assert first.slug != second.slug


async def test_a_slug_taken_under_another_key_or_none_is_a_bad_request(store: Store) -> None:
    await create(store, slug="nightly", idempotency_key="key-1")

    with pytest.raises(BadRequest, match="nightly"):
        await store.create_job(new_job(slug="nightly", idempotency_key="key-2"))
    with pytest.raises(BadRequest, match="nightly"):
        await store.create_job(new_job(slug="nightly"))
    assert 1 == len((await store.list_jobs()).jobs)


async def test_a_taken_slug_with_its_own_key_is_the_idempotent_replay(store: Store) -> None:
    first = await create(store, slug="nightly", idempotency_key="key-1")

    again, created = await store.create_job(new_job(slug="nightly", idempotency_key="key-1"))

    assert (first, False) == (again, created)


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"job_class": "urgent"}, "class"),
        ({"slug": "a:b"}, "slug"),
        ({"slug": ""}, "slug"),
        ({"slug": "-leading-dash"}, "slug"),
        ({"runner": "home:1"}, "runtime"),
        ({"runner": ""}, "runtime"),
        ({"model": ""}, "model"),
        ({"idempotency_key": ""}, "idempotency key"),
        ({"not_before": datetime(2026, 1, 1)}, "timezone-aware"),  # noqa: DTZ001 -- the point
    ],
)
def test_a_new_job_refuses_what_the_store_cannot_keep(
    overrides: dict[str, Any], match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        new_job(**overrides)


async def test_an_unknown_slug_has_no_job_and_no_events(store: Store) -> None:
    assert None is await store.get_job("job_nope")
    assert [] == await store.job_events("job_nope")


async def test_the_list_is_newest_first_and_filters_by_state_and_runner(store: Store) -> None:
    local_1 = await create(store)
    home = await create(store, runner="home-1")
    local_2 = await create(store)
    claimed = await store.claim_job(local_1.slug, lease_s=60)
    assert claimed is not None

    everything = await store.list_jobs()
    queued = await store.list_jobs(state="queued")
    local = await store.list_jobs(runner="local")
    queued_local = await store.list_jobs(state="queued", runner="local")

    assert [local_2.slug, home.slug, local_1.slug] == [job.slug for job in everything.jobs]
    assert [local_2.slug, home.slug] == [job.slug for job in queued.jobs]
    assert [local_2.slug, local_1.slug] == [job.slug for job in local.jobs]
    assert [local_2.slug] == [job.slug for job in queued_local.jobs]
    assert [] == (await store.list_jobs(state="completed")).jobs
    assert None is everything.next_cursor


async def test_the_cursor_pages_through_every_job_without_gaps_or_overlap(store: Store) -> None:
    jobs = [await create(store) for _ in range(7)]
    pages: list[list[str]] = []
    cursor: str | None = None

    while True:
        page = await store.list_jobs(limit=3, cursor=cursor)
        pages.append([job.slug for job in page.jobs])
        if page.next_cursor is None:
            break
        cursor = page.next_cursor

    assert [3, 3, 1] == [len(page) for page in pages]
    assert [job.slug for job in reversed(jobs)] == [slug for page in pages for slug in page]


async def test_a_full_last_page_has_no_next_cursor(store: Store) -> None:
    for _ in range(4):
        await create(store)

    first = await store.list_jobs(limit=2)
    assert first.next_cursor is not None
    second = await store.list_jobs(limit=2, cursor=first.next_cursor)

    assert (2, None) == (len(second.jobs), second.next_cursor)


async def test_the_cursor_combines_with_a_filter(store: Store) -> None:
    jobs = [await create(store, runner="home-1" if n % 2 else "local") for n in range(6)]

    first = await store.list_jobs(runner="home-1", limit=2)
    assert first.next_cursor is not None
    rest = await store.list_jobs(runner="home-1", limit=2, cursor=first.next_cursor)

    assert [jobs[5].slug, jobs[3].slug] == [job.slug for job in first.jobs]
    assert ([jobs[1].slug], None) == ([job.slug for job in rest.jobs], rest.next_cursor)


@pytest.mark.parametrize("cursor", ["", "abc", "-1", "1.5", "١٢", str(2**63), "9" * 30, " 1"])
async def test_a_malformed_cursor_is_a_bad_request(store: Store, cursor: str) -> None:
    with pytest.raises(BadRequest, match="cursor"):
        await store.list_jobs(cursor=cursor)


async def test_an_unknown_state_or_a_limit_below_one_is_refused(store: Store) -> None:
    with pytest.raises(ValueError, match="state"):
        await store.list_jobs(state="new")
    with pytest.raises(ValueError, match="limit"):
        await store.list_jobs(limit=0)


async def test_events_record_every_transition_in_order_with_who_where_and_when(
    store: Store, clock: ManualClock
) -> None:
    job = await create(store)
    steps: list[datetime] = [clock.now()]

    async def step() -> None:
        clock.advance(1)
        steps.append(clock.now())

    await step()
    claimed = await store.claim_job(job.slug, lease_s=600)
    assert claimed is not None
    token = claimed.lease_token
    assert token is not None
    await step()
    assert await store.promote_runner(job.slug, token, "home-1")
    await step()
    assert await store.record_attempt_failure(
        job.slug,
        token,
        runtime="home-1",
        error_code="UPSTREAM_UNREACHABLE",
        message="connection refused",
        retryable=True,
    )
    await step()
    assert await store.record_submit(
        job.slug, token, runtime="home-1", call_id="c-1", lease_s=60, running=False
    )
    await step()
    assert await store.mark_running(job.slug, token, actor="worker:home-1")
    await step()
    assert await store.record_progress(job.slug, token, {"tokens": 8})
    await step()
    assert await store.complete(
        job.slug, token, result={"id": "chatcmpl-1"}, cost_cents=1.5, actor="worker:home-1"
    )

    events = await store.job_events(job.slug)

    assert [
        ("queued", "api", "local", None, None, {}),
        ("dispatching", "dispatcher", "local", None, None, {}),
        ("walked", "dispatcher", "home-1", None, None, {"from": "local"}),
        (
            "failed",
            "dispatcher",
            "home-1",
            None,
            "UPSTREAM_UNREACHABLE",
            {"retryable": True, "message": "connection refused"},
        ),
        ("submitted", "dispatcher", "home-1", "c-1", None, {"submit_count": 1, "running": False}),
        ("running", "worker:home-1", "home-1", "c-1", None, {}),
        ("progress", "worker:home-1", "home-1", "c-1", None, {"tokens": 8}),
        ("completed", "worker:home-1", "home-1", "c-1", None, {"cost_cents": 1.5}),
    ] == [(e.status, e.actor, e.runtime, e.call_id, e.error_code, e.detail) for e in events]
    assert steps == [event.at for event in events]
    assert sorted(event.id for event in events) == [event.id for event in events]
    assert {job.slug} == {event.slug for event in events}


async def test_a_submit_running_from_the_start_appends_submitted_then_running_at_once(
    store: Store, clock: ManualClock
) -> None:
    """An upstream or serverless call runs from its submit: that transition has its own
    ``running`` event, written with ``submitted`` (one write), as a push call's ``claimed``
    appends one later."""
    job = await create(store)
    claimed = await store.claim_job(job.slug, lease_s=600)
    assert claimed is not None
    assert claimed.lease_token is not None
    clock.advance(1)

    assert await store.record_submit(
        job.slug, claimed.lease_token, runtime="local", call_id="c-1", lease_s=60, running=True
    )

    events = await store.job_events(job.slug)
    running = await store.get_job(job.slug)
    assert running is not None
    assert "running" == running.state
    assert [
        ("submitted", "dispatcher", "local", "c-1", {"submit_count": 1, "running": True}),
        ("running", "dispatcher", "local", "c-1", {}),
    ] == [(e.status, e.actor, e.runtime, e.call_id, e.detail) for e in events[2:]]
    assert 1 == len({event.at for event in events[2:]})


async def test_the_events_of_one_job_are_not_mixed_with_another(store: Store) -> None:
    first = await create(store)
    second = await create(store)
    await store.claim_job(second.slug, lease_s=60)

    assert ["queued"] == await statuses(store, first.slug)
    assert ["queued", "dispatching"] == await statuses(store, second.slug)


async def test_the_record_repr_leaves_out_the_input_the_result_and_the_token(
    store: Store,
) -> None:
    job = await create(store, input={"prompt": "secret-prompt"})
    claimed = await store.claim_job(job.slug, lease_s=60)
    assert claimed is not None
    assert claimed.lease_token is not None

    shown = repr(claimed)

    assert job.slug in shown
    assert "secret-prompt" not in shown
    assert claimed.lease_token not in shown
