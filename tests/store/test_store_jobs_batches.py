"""Writes in flight together are committed together, and each still gets its own answer."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import pytest

from gpugate.errors import BadRequest, StoreError
from gpugate.store import JobRecord, NewJob

if TYPE_CHECKING:
    from gpugate.store import Store


def new_job(**overrides: Any) -> NewJob:
    values: dict[str, Any] = {"model": "qwen-35b", "input": {"prompt": "hi"}, "runner": "local"}
    values.update(overrides)
    return NewJob(**values)


async def claimed(store: Store, count: int) -> list[tuple[JobRecord, str]]:
    """``count`` new jobs, each claimed by the dispatcher: the job and its lease token."""
    leases = []
    for _ in range(count):
        job, _ = await store.create_job(new_job())
        lease = await store.claim_job(job.slug, lease_s=600)
        assert lease is not None
        assert lease.lease_token is not None
        leases.append((lease, lease.lease_token))
    return leases


async def statuses(store: Store, slug: str) -> list[str]:
    return [event.status for event in await store.job_events(slug)]


async def test_concurrent_fenced_writes_each_get_their_own_answer(store: Store) -> None:
    leases = await claimed(store, 6)
    tokens = [token if n != 3 else "stale-token" for n, (_, token) in enumerate(leases)]

    answers = await asyncio.gather(
        *(
            store.complete(job.slug, token, result={"n": n}, actor="worker:local")
            for n, ((job, _), token) in enumerate(zip(leases, tokens, strict=True))
        )
    )

    jobs = [await store.get_job(job.slug) for job, _ in leases]
    assert [True, True, True, False, True, True] == answers
    assert [
        ("completed", {"n": 0}),
        ("completed", {"n": 1}),
        ("completed", {"n": 2}),
        ("dispatching", None),
        ("completed", {"n": 4}),
        ("completed", {"n": 5}),
    ] == [(job.state, job.result) for job in jobs if job is not None]
    assert ["queued", "dispatching"] == await statuses(store, leases[3][0].slug)
    assert ["queued", "dispatching", "completed"] == await statuses(store, leases[4][0].slug)


async def test_writes_of_one_job_in_flight_together_apply_in_order_and_see_each_other(
    store: Store,
) -> None:
    (job, token), (other, other_token) = await claimed(store, 2)
    await store.complete(other.slug, other_token, result={}, actor="worker:local")

    answers = await asyncio.gather(
        store.record_submit(
            job.slug, token, runtime="local", call_id="c-1", lease_s=60, running=True
        ),
        store.complete(job.slug, token, result={"ok": 1}, actor="worker:local"),
        store.complete(job.slug, token, result={"ok": 2}, actor="worker:local"),
        store.rescue(job.slug, token, max_rescues=3),
    )

    done = await store.get_job(job.slug)
    assert [True, True, False, None] == answers
    assert done is not None
    assert ("completed", {"ok": 1}, 1) == (done.state, done.result, done.submit_count)
    trail = ["queued", "dispatching", "submitted", "running", "completed"]
    assert trail == await statuses(store, job.slug)


async def test_one_write_that_cannot_be_stored_fails_alone(store: Store) -> None:
    leases = await claimed(store, 3)
    (first, first_token), (bad, bad_token), (last, last_token) = leases

    answers = await asyncio.gather(
        store.complete(first.slug, first_token, result={}, actor="worker:local"),
        store.record_progress(bad.slug, bad_token, {"not json": object()}),
        store.complete(last.slug, last_token, result={}, actor="worker:local"),
        return_exceptions=True,
    )

    assert (True, True) == (answers[0], answers[2])
    assert isinstance(answers[1], (TypeError, StoreError))
    assert ["queued", "dispatching"] == await statuses(store, bad.slug)
    assert "completed" == (await statuses(store, last.slug))[-1]


async def test_creates_in_flight_together_fail_only_the_one_whose_slug_is_taken(
    store: Store,
) -> None:
    await store.create_job(new_job(slug="nightly"))

    answers = await asyncio.gather(
        store.create_job(new_job(input={"n": 0})),
        store.create_job(new_job(slug="nightly", input={"n": 1})),
        store.create_job(new_job(input={"n": 2}, idempotency_key="k-2")),
        store.create_job(new_job(input={"n": 3}, idempotency_key="k-2")),
        return_exceptions=True,
    )

    assert isinstance(answers[1], BadRequest)
    created = [answer for answer in answers if isinstance(answer, tuple)]
    assert [({"n": 0}, True), ({"n": 2}, True), ({"n": 2}, False)] == [
        (job.input, fresh) for job, fresh in created
    ]
    page = await store.list_jobs(limit=10)
    assert 3 == len(page.jobs)
    for job, _ in created:
        assert ["queued"] == await statuses(store, job.slug)


@pytest.mark.parametrize("count", [1, 40])
async def test_every_job_created_together_is_queued_with_its_own_event(
    store: Store, count: int
) -> None:
    answers = await asyncio.gather(
        *(store.create_job(new_job(input={"n": n})) for n in range(count))
    )

    assert list(range(count)) == [job.input["n"] for job, _ in answers]
    assert all(created for _, created in answers)
    assert count == len({job.id for job, _ in answers})
    for job, _ in answers:
        assert ["queued"] == await statuses(store, job.slug)
