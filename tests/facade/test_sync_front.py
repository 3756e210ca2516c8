"""``POST /v1/jobs?wait=S``: replay → result cache → shed gate → dispatch, then wait."""

from __future__ import annotations

from sync_rig import sync_rig

CACHE = {"ttl_s": 600, "max_entries": 8}


def chat(text: str) -> dict[str, object]:
    return {"messages": [{"role": "user", "content": text}], "temperature": 0}


async def test_a_job_finishing_within_wait_is_answered_200_with_its_result(
    sqlite_dsn: str,
) -> None:
    async with sync_rig(sqlite_dsn) as r:
        status, headers, body = await r.submit(chat("hello"))
    assert (status, body["state"]) == (200, "completed")
    assert body["result"]["object"] == "chat.completion"
    assert "x-gateway-cache" not in headers


async def test_a_job_still_running_when_wait_ends_is_answered_202_to_poll(
    sqlite_dsn: str,
) -> None:
    async with sync_rig(sqlite_dsn) as r:
        r.server.update(hang=True)
        status, _, body = await r.submit(chat("slow"), wait="0")
        r.server.update(hang=False)
    assert status == 202
    assert body["state"] in ("queued", "dispatching", "running")


async def test_a_repeated_idempotency_key_replays_the_same_job_without_a_second_run(
    sqlite_dsn: str,
) -> None:
    async with sync_rig(sqlite_dsn, cache=CACHE) as r:
        key = {"Idempotency-Key": "report-1"}
        first = await r.submit(chat("once"), headers=key)
        second = await r.submit(chat("once"), headers=key)
        calls, jobs = r.upstream_calls, await r.jobs()
    assert first[2]["slug"] == second[2]["slug"]
    assert (second[0], second[2]["state"]) == (200, "completed")
    assert "x-gateway-cache" not in second[1]  # a replay, not a cache hit
    assert (calls, jobs) == (1, 1)


async def test_an_identical_input_is_served_from_the_cache_whatever_its_key_order(
    sqlite_dsn: str,
) -> None:
    async with sync_rig(sqlite_dsn, cache=CACHE) as r:
        miss = await r.submit({"temperature": 0, "messages": [{"content": "a", "role": "user"}]})
        hit = await r.submit({"messages": [{"role": "user", "content": "a"}], "temperature": 0})
        other = await r.submit(chat("b"))
        calls, jobs = r.upstream_calls, await r.jobs()
    assert (miss[0], miss[1]["x-gateway-cache"]) == (200, "miss")
    assert (hit[0], hit[1]["x-gateway-cache"]) == (200, "hit")
    assert hit[2] == miss[2]
    assert other[1]["x-gateway-cache"] == "miss"
    assert (calls, jobs) == (2, 2)


async def test_cache_control_no_cache_runs_the_job_again(sqlite_dsn: str) -> None:
    async with sync_rig(sqlite_dsn, cache=CACHE) as r:
        await r.submit(chat("a"))
        fresh = await r.submit(chat("a"), headers={"Cache-Control": "no-cache"})
        calls = r.upstream_calls
    assert (fresh[0], fresh[1]["x-gateway-cache"]) == (200, "miss")
    assert calls == 2


async def test_a_failed_job_is_answered_200_with_its_error_and_never_cached(
    sqlite_dsn: str,
) -> None:
    async with sync_rig(sqlite_dsn, cache=CACHE) as r:
        r.server.update(fail_status=400)
        failed = await r.submit(chat("bad"))
        r.server.update(fail_status=None)
        retried = await r.submit(chat("bad"))
    assert (failed[0], failed[2]["state"], failed[2]["error"]["code"]) == (
        200,
        "failed",
        "UPSTREAM_400",
    )
    assert (retried[2]["state"], retried[1]["x-gateway-cache"]) == ("completed", "miss")


async def test_under_saturation_a_cached_result_is_served_and_an_uncached_batch_job_is_429(
    sqlite_dsn: str,
) -> None:
    """Done-when 1 of issue 9: counted in shed increments and upstream calls."""
    async with sync_rig(sqlite_dsn, cache=CACHE) as r:
        await r.submit(chat("cached"))
        await r.saturate()
        calls, shed, jobs = r.upstream_calls, r.shed, await r.jobs()

        hit = await r.submit(chat("cached"))
        after_hit = (r.upstream_calls - calls, r.shed - shed, await r.jobs() - jobs)
        refused = await r.submit(chat("not cached"))
        after_refusal = (r.upstream_calls - calls, r.shed - shed, await r.jobs() - jobs)
        interactive = await r.submit(chat("not cached"), cls="interactive")
        async with r.http.get(r.gw.url + "/metrics") as resp:
            metrics = await resp.text()

    assert (hit[0], hit[1]["x-gateway-cache"], hit[2]["state"]) == (200, "hit", "completed")
    assert after_hit == (0, 0, 0)
    assert (refused[0], refused[2]["error"]["code"]) == (429, "GPU_SATURATED")
    assert int(refused[1]["retry-after"]) >= 1
    assert after_refusal == (0, 1, 0)
    assert (interactive[0], interactive[2]["state"]) == (200, "completed")
    assert 'gateway_gpu_shed_total{site="sync_front"} 1.0' in metrics


async def test_wait_must_be_a_number_of_seconds(sqlite_dsn: str) -> None:
    async with sync_rig(sqlite_dsn) as r:
        answers = [await r.submit(chat("x"), wait=wait) for wait in ("soon", "-1", "nan")]
        jobs = await r.jobs()
    assert [(status, body["error"]["code"]) for status, _, body in answers] == [
        (400, "BAD_REQUEST")
    ] * 3
    assert jobs == 0
