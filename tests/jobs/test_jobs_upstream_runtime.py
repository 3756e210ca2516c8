"""The ``upstream`` runtime on its own: what it sends, when, and what it remembers."""

from __future__ import annotations

import pytest
from jobs_rig import rig

from gpugate.errors import GpuSaturated, RuntimeRejected
from gpugate.services.gpu_monitor import GpuMonitor


async def test_a_call_does_not_reach_the_upstream_before_it_is_confirmed(dsn: str) -> None:
    async with rig(dsn) as r:
        job = await r.submit("j1")
        submission = await r.local.submit(job, "token-of-a-claim")
        before = await r.local.status(submission.call_id)
        await r.local.cancel(submission.call_id)
        await r.idle()
        after = await r.local.status(submission.call_id)
    assert submission.running
    assert ("queued", "unknown") == (before.state, after.state)
    assert {} == r.executions()


async def test_the_request_carries_the_jobs_slug_and_its_model_over_the_inputs(
    dsn: str,
) -> None:
    async with rig(dsn) as r:
        chat = {"model": "something-else", "messages": [{"role": "user", "content": "hi"}]}
        await r.submit("j1", job_input=chat)
        await r.dispatcher.tick()
        await r.idle()
        job = await r.job("j1")
    assert ("completed", "qwen") == (job.state, job.result["model"])
    assert {"j1": 1} == r.executions()


async def test_the_operation_picks_the_route_embeddings_included(dsn: str) -> None:
    async with rig(dsn, servers={"q0": ["bge-m3"]}) as r:
        await r.submit("e1", model="bge-m3", operation="embeddings", job_input={"input": "hi"})
        await r.dispatcher.tick()
        await r.idle()
        job = await r.job("e1")
    assert ("completed", "list") == (job.state, job.result["object"])
    assert 1 == r.servers["q0"].stats.requests["/v1/embeddings"]


async def test_every_transition_of_a_job_on_the_upstream_runtime_has_its_event(dsn: str) -> None:
    """The call runs from its submit: ``running`` follows ``submitted`` at once (no push
    worker claims it), so the trail names every state the job was in."""
    async with rig(dsn) as r:
        await r.submit("j1")
        await r.dispatcher.tick()
        await r.idle()
        trail = await r.trail("j1")
        job = await r.job("j1")
    assert [
        ("queued", "local", None),
        ("dispatching", "local", None),
        ("submitted", "local", None),
        ("running", "local", None),
        ("completed", "local", None),
    ] == trail
    assert "completed" == job.state


async def test_a_finished_call_is_still_answered_for_when_the_reaper_asks(dsn: str) -> None:
    async with rig(dsn) as r:
        await r.submit("j1")
        await r.dispatcher.tick()
        await r.idle()
        (submitted,) = [e for e in await r.events("j1") if e.status == "submitted"]
        status = await r.local.status(submitted.call_id or "")
    assert ("completed", "chat.completion") == (status.state, status.result["object"])


async def test_an_operation_that_is_not_a_plain_path_is_rejected_as_not_retryable(
    dsn: str,
) -> None:
    async with rig(dsn) as r:
        odd = await r.submit("j1", operation="../admin")
        with pytest.raises(RuntimeRejected, match="invalid operation") as caught:
            await r.local.submit(odd, "token")
    assert not caught.value.retryable


async def test_only_batch_is_shed_at_submit_interactive_jobs_go_through(dsn: str) -> None:
    shed = {"poll_s": 3600, "staleness_s": 60, "sustained_samples": 2, "shed_batch": True}
    async with rig(dsn, gpu_health=shed) as r:
        assert r.exporter is not None
        monitor = r.gateway.monitor
        assert isinstance(monitor, GpuMonitor)
        r.exporter.set_gpu(0, util=99)
        for _ in range(2):
            r.clock.advance(15)
            await monitor.tick()
        batch = await r.submit("b1")
        await r.submit("i1", job_class="interactive")
        with pytest.raises(GpuSaturated) as refused:
            await r.local.submit(batch, "token")
        await r.dispatcher.tick()
        await r.idle()
        states = ((await r.job("b1")).state, (await r.job("i1")).state)
    assert 3600 == refused.value.retry_after_s
    assert ("queued", "completed") == states
