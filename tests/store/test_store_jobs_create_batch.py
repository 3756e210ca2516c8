"""A batch of creates (SQLite: one statement of the batch's rows as a JSON document) stores
every value as given, in the order the creates came."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from gpugate.errors import StoreError
from gpugate.store import NewJob

if TYPE_CHECKING:
    from gpugate.store import Store

AWKWARD_INPUT: dict[str, Any] = {
    "messages": [{"role": "user", "content": 'naïve "quotes" \\ back\nslash \u00e9 \U0001f600 \t'}],
    "n": 12345678901234567890,
    "t": 0.1,
    "e": 1e-300,
    "empty": {},
    "nothing": None,
    "flags": [True, False],
}


async def test_every_value_of_jobs_created_together_reads_back_as_given(store: Store) -> None:
    not_before = datetime(2031, 1, 2, 3, 4, 5, tzinfo=UTC)
    news = [
        NewJob(model="qwen-35b", input=AWKWARD_INPUT, runner="local", idempotency_key="k-a"),
        NewJob(
            model="llama-8b",
            input={"prompt": "two"},
            runner="remote",
            job_class="interactive",
            operation="embeddings",
            slug="my-own-slug",
            allow_external=False,
            input_ref="blobs/in/1",
            not_before=not_before,
        ),
    ]

    answers = await asyncio.gather(*(store.create_job(new) for new in news))

    for new, (job, created) in zip(news, answers, strict=True):
        assert created
        read = await store.get_job(job.slug)
        assert read == job
        assert (new.model, new.input, new.runner) == (job.model, job.input, job.runner)
        assert (new.job_class, new.operation) == (job.job_class, job.operation)
        assert (new.idempotency_key, new.input_ref) == (job.idempotency_key, job.input_ref)
        assert (new.not_before, new.allow_external) == (job.not_before, job.allow_external)
        assert "queued" == job.state
        assert job.created_at == job.updated_at
    assert "my-own-slug" == answers[1][0].slug
    assert answers[1][0].allow_external is False


async def test_jobs_created_together_take_ids_in_the_order_they_came_and_are_claimed_so(
    store: Store,
) -> None:
    answers = await asyncio.gather(
        *(store.create_job(NewJob(model="m", input={"n": n}, runner="local")) for n in range(20))
    )
    ids = [job.id for job, _ in answers]
    assert sorted(ids) == ids

    claimed = await store.claim_jobs(limit=20, lease_s=60)
    assert ids == [job.id for job in claimed]


async def test_each_queued_event_is_at_its_jobs_creation_time(store: Store) -> None:
    answers = await asyncio.gather(
        *(store.create_job(NewJob(model="m", input={"n": n}, runner="local")) for n in range(5))
    )
    for job, _ in answers:
        [event] = await store.job_events(job.slug)
        assert ("queued", "api", "local") == (event.status, event.actor, event.runtime)
        assert job.created_at == event.at


async def test_a_create_whose_input_json_cannot_hold_fails_alone(store: Store) -> None:
    answers = await asyncio.gather(
        store.create_job(NewJob(model="m", input={"x": float("nan")}, runner="local")),
        store.create_job(NewJob(model="m", input={"x": object()}, runner="local")),
        store.create_job(NewJob(model="m", input={"x": 1}, runner="local")),
        return_exceptions=True,
    )

    assert isinstance(answers[0], StoreError)
    assert isinstance(answers[1], StoreError)
    assert not isinstance(answers[2], BaseException)
    job, created = answers[2]
    assert created
    assert [job.slug] == [listed.slug for listed in (await store.list_jobs(limit=10)).jobs]
