"""The dispatcher's walk on a real store, through the gateway's own upstreams (DESIGN §5)."""

from __future__ import annotations

from jobs_rig import modal_runtime, push_runtime, rig

from gpugate.errors import (
    RuntimeAuthFailed,
    RuntimeRejected,
    RuntimeTimeout,
    RuntimeUnreachable,
)
from harness import eventually


async def test_a_job_runs_on_the_local_upstream_and_completes_with_its_json(dsn: str) -> None:
    async with rig(dsn) as r:
        await r.submit("j1")
        report = await r.dispatcher.tick()
        await r.idle()
        job = await r.job("j1")
        trail = await r.trail("j1")
    assert (1, 1) == (report.claimed, report.dispatched)
    assert ("completed", "chat.completion") == (job.state, job.result["object"])
    assert (1, {"local": 1}, None) == (job.submit_count, job.attempts, job.leased_by)
    assert ["queued", "dispatching", "submitted", "running", "completed"] == [
        status for status, _, _ in trail
    ]
    assert {"j1": 1} == r.executions()


async def test_while_the_call_runs_the_lease_names_the_runtime_and_the_call(dsn: str) -> None:
    async with rig(dsn) as r:
        r.servers["q0"].update(hang=True)
        await r.submit("j1")
        await r.dispatcher.tick()
        job = await r.job("j1")
        (submitted,) = [e for e in await r.events("j1") if e.status == "submitted"]
        await eventually(lambda: r.servers["q0"].stats.open_requests == 1, what="call started")
        status = await r.local.status(submitted.call_id or "")
        r.servers["q0"].update(hang=False)
        await r.idle()
        done = await r.job("j1")
    assert "running" == job.state
    assert f"local:{submitted.call_id}" == job.leased_by
    assert ("local", "running") == (submitted.runtime, status.state)
    assert "completed" == done.state


async def test_a_batch_of_jobs_is_dispatched_at_once_and_none_is_executed_twice(dsn: str) -> None:
    slugs = [f"job-{n}" for n in range(25)]
    async with rig(dsn) as r:
        for slug in slugs:
            await r.submit(slug)
        report = await r.dispatcher.drain()
        await r.idle()
        states = {(await r.job(slug)).state for slug in slugs}
    assert 25 == report.dispatched
    assert {"completed"} == states
    assert dict.fromkeys(slugs, 1) == r.executions()


async def test_a_retryable_failure_is_retried_once_in_place_then_the_walk_goes_on(
    dsn: str,
) -> None:
    runtimes = [push_runtime("home-1"), {"id": "local", "kind": "upstream"}]
    async with rig(dsn, runtimes=runtimes, chain=["home-1", "local"]) as r:
        home = r.scripted("home-1")
        home.script = [RuntimeUnreachable("worker down"), RuntimeTimeout("worker slow")]
        await r.submit("j1")
        report = await r.dispatcher.tick()
        await r.idle()
        job = await r.job("j1")
        trail = await r.trail("j1")
        (walked,) = [e for e in await r.events("j1") if e.status == "walked"]
    assert ["j1", "j1"] == home.submits
    assert (1, 1) == (report.dispatched, report.walked)
    # the walked event says where from and why: the last error there
    assert "home-1" == walked.detail["from"]
    assert walked.detail["why"].startswith("RUNTIME_TIMEOUT")
    assert ("completed", "local", {"home-1": 2, "local": 1}) == (
        job.state,
        job.runner,
        job.attempts,
    )
    assert [
        ("failed", "home-1", "RUNTIME_UNREACHABLE"),
        ("failed", "home-1", "RUNTIME_TIMEOUT"),
        ("walked", "local", None),
        ("submitted", "local", None),
    ] == [t for t in trail if t[0] in ("failed", "walked", "submitted")]


async def test_a_non_retryable_failure_is_not_retried_and_falls_back_to_the_next_runtime(
    dsn: str,
) -> None:
    runtimes = [push_runtime("home-1"), {"id": "local", "kind": "upstream"}]
    async with rig(dsn, runtimes=runtimes, chain=["home-1", "local"]) as r:
        r.scripted("home-1").script = [RuntimeRejected("model not loaded")]
        await r.submit("j1")
        await r.dispatcher.tick()
        await r.idle()
        job = await r.job("j1")
        (failure,) = [e for e in await r.events("j1") if e.status == "failed"]
    assert ["j1"] == r.scripted("home-1").submits
    assert ("completed", "local") == (job.state, job.runner)
    assert ("home-1", "RUNTIME_REJECTED", False) == (
        failure.runtime,
        failure.error_code,
        failure.detail["retryable"],
    )
    assert "model not loaded" in failure.detail["message"]


async def test_after_the_last_runtime_the_job_fails_chain_exhausted_with_each_error(
    dsn: str,
) -> None:
    runtimes = [push_runtime("home-1"), modal_runtime("beta")]
    async with rig(dsn, runtimes=runtimes, chain=["home-1", "beta"]) as r:
        r.scripted("home-1").script = [RuntimeAuthFailed("401 from the worker")]
        r.scripted("beta").script = [RuntimeTimeout("cold start"), RuntimeTimeout("cold start")]
        await r.submit("j1")
        report = await r.dispatcher.tick()
        job = await r.job("j1")
        trail = await r.trail("j1")
    assert 1 == report.failed
    assert ("failed", "CHAIN_EXHAUSTED") == (job.state, job.error_code)
    assert "home-1: RUNTIME_AUTH_FAILED: 401 from the worker" in (job.error_message or "")
    assert "beta: RUNTIME_TIMEOUT: cold start" in (job.error_message or "")
    assert [
        ("failed", "home-1", "RUNTIME_AUTH_FAILED"),
        ("failed", "beta", "RUNTIME_TIMEOUT"),
        ("failed", "beta", "RUNTIME_TIMEOUT"),
        ("failed", "beta", "CHAIN_EXHAUSTED"),
    ] == [t for t in trail if t[0] == "failed"]


async def test_disabled_mismatched_unreachable_and_over_budget_runtimes_get_no_submit(
    dsn: str,
) -> None:
    runtimes = [
        push_runtime("off"),
        push_runtime("embedder", models=["bge-m3"]),
        push_runtime("far"),
        modal_runtime("pricey"),
        {"id": "local", "kind": "upstream"},
    ]
    chain = ["off", "embedder", "far", "pricey", "local"]
    async with rig(dsn, runtimes=runtimes, chain=chain, default="off") as r:
        r.disabled.add("off")
        r.unreachable.add("far")
        r.over_budget.add("pricey")
        await r.submit("j1")
        await r.dispatcher.tick()
        await r.idle()
        job = await r.job("j1")
    assert ("completed", "local") == (job.state, job.runner)
    assert [] == [rt for rt in ("off", "embedder", "far", "pricey") if r.scripted(rt).submits]


async def test_a_chain_of_runtimes_that_are_all_skipped_fails_naming_why(dsn: str) -> None:
    runtimes = [push_runtime("off"), {"id": "local", "kind": "upstream"}]
    async with rig(dsn, runtimes=runtimes, chain=["off", "local"]) as r:
        r.disabled.update({"off", "local"})
        await r.submit("j1")
        await r.dispatcher.tick()
        job = await r.job("j1")
    assert ("failed", "CHAIN_EXHAUSTED") == (job.state, job.error_code)
    assert "off: skipped (disabled); local: skipped (disabled)" == job.error_message


async def test_a_job_that_may_not_leave_the_building_never_goes_external(dsn: str) -> None:
    runtimes = [{"id": "local", "kind": "upstream"}, modal_runtime("beta", models=["gpt"])]
    servers = {"q0": ["qwen"], "openai": ["gpt"]}
    async with rig(dsn, servers=servers, external=frozenset({"openai"}), runtimes=runtimes) as r:
        await r.submit("j1", model="gpt", allow_external=False)
        await r.dispatcher.tick()
        job = await r.job("j1")
    assert ("failed", "EXTERNAL_UPSTREAM_FORBIDDEN") == (job.state, job.error_code)
    assert [] == r.scripted("beta").submits
    assert {} == r.executions("openai")


async def test_a_job_that_may_not_leave_goes_to_the_internal_one_of_mixed_upstreams(
    dsn: str,
) -> None:
    servers = {"q0": ["qwen"], "hosted": ["qwen"]}
    async with rig(dsn, servers=servers, external=frozenset({"hosted"})) as r:
        for n in range(8):
            await r.submit(f"j{n}", allow_external=False)
        await r.dispatcher.drain()
        await r.idle()
        states = {(await r.job(f"j{n}")).state for n in range(8)}
    assert {"completed"} == states
    assert 8 == len(r.executions("q0"))
    assert {} == r.executions("hosted")


async def test_an_upstream_4xx_fails_the_job_with_the_upstream_status(dsn: str) -> None:
    async with rig(dsn) as r:
        r.servers["q0"].update(fail_status=422)
        await r.submit("j1")
        await r.dispatcher.tick()
        await r.idle()
        job = await r.job("j1")
    assert ("failed", "UPSTREAM_422") == (job.state, job.error_code)
    assert "injected failure" in (job.error_message or "")


async def test_an_upstream_5xx_spends_the_runtimes_attempts_and_the_job_walks_on(
    dsn: str,
) -> None:
    runtimes = [{"id": "local", "kind": "upstream"}, push_runtime("home-1")]
    async with rig(dsn, runtimes=runtimes, chain=["local", "home-1"]) as r:
        r.servers["q0"].update(fail_status=503)
        await r.submit("j1")
        await r.dispatcher.tick()
        await r.idle()
        released = await r.job("j1")
        await r.dispatcher.drain()  # woken by the call's end: no clock moved
        walked = await r.job("j1")
        trail = await r.trail("j1")
    assert ("queued", {"local": 2}) == (released.state, released.attempts)
    assert ("dispatching", "home-1") == (walked.state, walked.runner)
    assert ("home-1:home-1-call-1") == walked.leased_by
    assert ("failed", "local", "UPSTREAM_503") in trail
    assert ("released", "local", "UPSTREAM_503") in trail


async def test_when_the_only_runtime_keeps_failing_the_job_fails_with_its_last_error(
    dsn: str,
) -> None:
    async with rig(dsn) as r:
        r.servers["q0"].update(fail_status=502)
        await r.submit("j1")
        await r.dispatcher.tick()
        await r.idle()
        await r.dispatcher.drain()
        job = await r.job("j1")
    assert ("failed", "CHAIN_EXHAUSTED") == (job.state, job.error_code)
    assert (job.error_message or "").startswith("local: UPSTREAM_502: the upstream answered 502")
    assert (job.error_message or "").endswith("(attempts spent)")


async def test_the_dispatcher_sums_up_what_it_did(dsn: str) -> None:
    runtimes = [push_runtime("home-1"), {"id": "local", "kind": "upstream"}]
    async with rig(dsn, runtimes=runtimes, chain=["home-1", "local"]) as r:
        r.scripted("home-1").script = [RuntimeRejected("no")]
        await r.submit("j1")
        await r.dispatcher.tick()
        await r.idle()
    assert "<Dispatcher dispatched=1 walked=1 deferred=0 failed=0>" == repr(r.dispatcher)
