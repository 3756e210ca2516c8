"""Every replica wakes at once for a new job: LISTEN/NOTIFY on PostgreSQL, not the sweep."""

from __future__ import annotations

import asyncio

import pytest

from gpugate.clock import SystemClock
from gpugate.store import NewJob
from gpugate.store.factory import open_store
from harness import make_config, model_servers, serving, upstream


@pytest.mark.postgres
async def test_a_job_created_by_another_process_is_dispatched_at_once_not_at_the_sweep(
    jobs_schema: str,
) -> None:
    """The job is written through a second store (as another replica would): nothing wakes
    the gateway in-process, and its sweep is an hour away."""
    async with model_servers(("q0", ["qwen"])) as (server,):
        config = make_config(
            jobs_schema, [upstream("q0", [server.url], ["qwen"])], jobs={"sweep_s": 3600}
        )
        async with serving(config) as gw:
            other = open_store(jobs_schema, clock=SystemClock())
            await other.open()
            try:
                chat = {"messages": [{"role": "user", "content": "hi"}]}
                job, _ = await other.create_job(
                    NewJob(model="qwen", input=chat, runner="local", slug="n1")
                )
            finally:
                await other.close()
            store = gw.gateway.store
            async with asyncio.timeout(5):
                while (current := await store.get_job(job.slug)) is None or (
                    current.state != "completed"
                ):
                    await asyncio.sleep(0.01)
    assert {"n1": 1} == server.stats.executions
