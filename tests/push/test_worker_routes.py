"""The worker routes on both store backends: a push worker drives its job with the runtime's
secret and the lease's current token — and nothing else changes a job (DESIGN §3).

Every refusal is pinned with "nothing changes": the job row and its events are the same
before and after.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import aiohttp
import pytest
from push_rig import SECRETS, leased, push_config, send, worker_headers

from gpugate import push_signature
from gpugate.clock import ManualClock
from gpugate.fleet import ModelServer
from gpugate.store import JobRecord
from harness import RunningGateway, make_config, serving, upstream

HOME1, HOME2 = SECRETS["HOME1_SECRET"], SECRETS["HOME2_SECRET"]


@pytest.fixture
async def gw(dsn: str) -> AsyncIterator[RunningGateway]:
    """The gateway with its job loops stopped: only the worker routes move jobs."""
    async with (
        ModelServer(["qwen"], name="q0") as fake,
        serving(
            push_config(dsn, fake.url, jobs={"quiet_s": 30}),
            environ=SECRETS,
            clock=ManualClock(),
            run_job_loops=False,
        ) as running,
    ):
        yield running


async def snapshot(gw: RunningGateway, slug: str) -> tuple[JobRecord | None, list[Any]]:
    store = gw.gateway.store
    return await store.get_job(slug), await store.job_events(slug)


def url(gw: RunningGateway, slug: str, route: str = "") -> str:
    return f"{gw.url}/v1/jobs/{slug}{route}"


async def test_claimed_makes_the_job_running_for_the_runtime_holding_the_lease(
    gw: RunningGateway, http: aiohttp.ClientSession
) -> None:
    job = await leased(gw.gateway.store, "j1")

    status, body = await send(
        http, "POST", url(gw, "j1", "/claimed"), secret=HOME1, token=job.lease_token
    )

    assert (200, "running", 30) == (status, body["state"], body["lease_s"])
    after = await gw.gateway.store.get_job("j1")
    assert after is not None
    assert "running" == after.state
    events = await gw.gateway.store.job_events("j1")
    assert ("running", "worker:home-1") == (events[-1].status, events[-1].actor)


async def test_claimed_before_the_dispatcher_recorded_the_call_is_taken_from_the_runner(
    gw: RunningGateway, http: aiohttp.ClientSession
) -> None:
    """A fast worker may claim while the dispatcher still records its submit."""
    job = await leased(gw.gateway.store, "j1", recorded=False)

    status, _ = await send(
        http, "POST", url(gw, "j1", "/claimed"), secret=HOME1, token=job.lease_token
    )

    assert 200 == status
    after = await gw.gateway.store.get_job("j1")
    assert after is not None
    assert "running" == after.state
    events = await gw.gateway.store.job_events("j1")
    assert ("running", "worker:home-1") == (events[-1].status, events[-1].actor)


@pytest.mark.parametrize(
    ("route", "method", "body"),
    [
        ("/claimed", "POST", None),
        ("/lease", "POST", None),
        ("", "PATCH", {"result": {"answer": 42}}),
        ("/fail", "POST", {"error_code": "BOOM", "message": "x", "retryable": False}),
    ],
)
async def test_a_wrong_secret_another_runtimes_secret_or_a_stale_token_changes_nothing(
    gw: RunningGateway, http: aiohttp.ClientSession, route: str, method: str, body: Any
) -> None:
    job = await leased(gw.gateway.store, "j1")
    before = await snapshot(gw, "j1")
    target = url(gw, "j1", route)

    wrong = await send(http, method, target, secret="guess", token=job.lease_token, body=body)
    other = await send(http, method, target, secret=HOME2, token=job.lease_token, body=body)
    stale = await send(http, method, target, secret=HOME1, token="an-old-token", body=body)
    tokenless = await send(http, method, target, secret=HOME1, token=None, body=body)

    assert (401, "UNAUTHORIZED") == (wrong[0], wrong[1]["error"]["code"])
    assert (403, "WRONG_RUNTIME") == (other[0], other[1]["error"]["code"])
    assert (409, "LEASE_TOKEN_STALE") == (stale[0], stale[1]["error"]["code"])
    assert (400, "BAD_REQUEST") == (tokenless[0], tokenless[1]["error"]["code"])
    assert before == await snapshot(gw, "j1")


async def test_a_finished_jobs_token_is_stale_and_changes_nothing(
    gw: RunningGateway, http: aiohttp.ClientSession
) -> None:
    job = await leased(gw.gateway.store, "j1")
    target = url(gw, "j1")
    assert 200 == (await send(http, "PATCH", target, secret=HOME1, token=job.lease_token,
                              body={"result": "first"}))[0]  # fmt: skip
    before = await snapshot(gw, "j1")

    status, body = await send(
        http, "PATCH", target, secret=HOME1, token=job.lease_token, body={"result": "second"}
    )

    assert (409, "LEASE_TOKEN_STALE") == (status, body["error"]["code"])
    assert before == await snapshot(gw, "j1")


async def test_an_unknown_job_is_not_found(gw: RunningGateway, http: aiohttp.ClientSession) -> None:
    status, body = await send(http, "POST", url(gw, "nope", "/claimed"), secret=HOME1, token="t")

    assert (404, "JOB_NOT_FOUND") == (status, body["error"]["code"])


async def test_the_lease_is_extended_by_quiet_s_from_now(
    gw: RunningGateway, http: aiohttp.ClientSession
) -> None:
    job = await leased(gw.gateway.store, "j1")
    now = gw.gateway.clock.now()

    status, body = await send(
        http, "POST", url(gw, "j1", "/lease"), secret=HOME1, token=job.lease_token
    )

    after = await gw.gateway.store.get_job("j1")
    assert after is not None
    assert (200, now + timedelta(seconds=30)) == (status, after.lease_expires_at)
    assert (now + timedelta(seconds=30)).isoformat() == body["lease_expires_at"]


async def test_a_result_completes_the_job_with_the_reported_cost(
    gw: RunningGateway, http: aiohttp.ClientSession
) -> None:
    job = await leased(gw.gateway.store, "j1")

    status, body = await send(
        http, "PATCH", url(gw, "j1"), secret=HOME1, token=job.lease_token,
        body={"result": {"answer": 42}, "cost_cents": 7, "duration_s": 100},
    )  # fmt: skip

    after = await gw.gateway.store.get_job("j1")
    assert after is not None
    assert (200, "completed") == (status, body["state"])
    assert ("completed", {"answer": 42}, 7.0) == (after.state, after.result, after.cost_cents)


async def test_a_result_without_a_cost_costs_its_duration_times_cents_per_second(
    gw: RunningGateway, http: aiohttp.ClientSession
) -> None:
    job = await leased(gw.gateway.store, "j1")

    await send(http, "PATCH", url(gw, "j1"), secret=HOME1, token=job.lease_token,
               body={"result": "ok", "duration_s": 3})  # fmt: skip

    after = await gw.gateway.store.get_job("j1")
    assert after is not None
    assert 1.5 == after.cost_cents  # 3 s x 0.5 cents/s


async def test_progress_is_an_event_and_the_job_keeps_running(
    gw: RunningGateway, http: aiohttp.ClientSession
) -> None:
    job = await leased(gw.gateway.store, "j1")

    status, _ = await send(http, "PATCH", url(gw, "j1"), secret=HOME1, token=job.lease_token,
                           body={"progress": {"tokens": 10}})  # fmt: skip

    events = await gw.gateway.store.job_events("j1")
    assert (200, "progress", {"tokens": 10}) == (status, events[-1].status, events[-1].detail)


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"progress": [1]},
        {"result": 1, "cost_cents": -1},
        {"result": 1, "surprise": True},
    ],
)
async def test_a_malformed_report_is_a_bad_request_and_changes_nothing(
    gw: RunningGateway, http: aiohttp.ClientSession, body: dict[str, Any]
) -> None:
    job = await leased(gw.gateway.store, "j1")
    before = await snapshot(gw, "j1")

    status, answer = await send(
        http, "PATCH", url(gw, "j1"), secret=HOME1, token=job.lease_token, body=body
    )

    assert (400, "BAD_REQUEST") == (status, answer["error"]["code"])
    assert before == await snapshot(gw, "j1")


async def test_a_retryable_failure_counts_the_attempt_and_puts_the_job_back_in_the_queue(
    gw: RunningGateway, http: aiohttp.ClientSession
) -> None:
    job = await leased(gw.gateway.store, "j1")

    status, body = await send(
        http, "POST", url(gw, "j1", "/fail"), secret=HOME1, token=job.lease_token,
        body={"error_code": "UPSTREAM_503", "message": "busy", "retryable": True},
    )  # fmt: skip

    after = await gw.gateway.store.get_job("j1")
    assert after is not None
    assert (200, "queued") == (status, body["state"])
    assert ("queued", None, 2) == (after.state, after.lease_token, after.attempts["home-1"])


async def test_a_failure_that_is_not_retryable_fails_the_job_for_good(
    gw: RunningGateway, http: aiohttp.ClientSession
) -> None:
    job = await leased(gw.gateway.store, "j1")

    failure = {"error_code": "UPSTREAM_400", "message": "bad input", "retryable": False}

    await send(
        http, "POST", url(gw, "j1", "/fail"), secret=HOME1, token=job.lease_token, body=failure
    )

    after = await gw.gateway.store.get_job("j1")
    assert after is not None
    assert ("failed", "UPSTREAM_400") == (after.state, after.error_code)


async def test_the_worker_routes_are_in_the_openapi_schema(
    gw: RunningGateway, http: aiohttp.ClientSession
) -> None:
    async with http.get(gw.url + "/openapi.json") as resp:
        schema = await resp.json()

    paths = schema["paths"]
    assert {"post"} == set(paths["/v1/jobs/{slug}/claimed"])
    assert {"patch"} <= set(paths["/v1/jobs/{slug}"])
    assert "409" in paths["/v1/jobs/{slug}/fail"]["post"]["responses"]
    assert (
        "LEASE_TOKEN_STALE"
        in paths["/v1/jobs/{slug}/lease"]["post"]["responses"]["409"]["description"]
    )


async def test_a_failure_with_an_unknown_key_is_refused_naming_it_and_changes_nothing(
    gw: RunningGateway, http: aiohttp.ClientSession
) -> None:
    job = await leased(gw.gateway.store, "j1")
    before = await snapshot(gw, "j1")
    failure = {"error_code": "BOOM", "message": "x", "retryable": False, "surprise": 1}

    status, answer = await send(
        http, "POST", url(gw, "j1", "/fail"), secret=HOME1, token=job.lease_token, body=failure
    )

    assert (400, "BAD_REQUEST") == (status, answer["error"]["code"])
    assert (
        "surprise: unknown key (allowed: error_code, message, retryable)"
        == answer["error"]["message"]
    )
    assert before == await snapshot(gw, "j1")


async def test_a_malformed_report_is_refused_naming_each_key_path(
    gw: RunningGateway, http: aiohttp.ClientSession
) -> None:
    job = await leased(gw.gateway.store, "j1")
    body = {"progress": [1], "cost_cents": "3"}

    status, answer = await send(
        http, "PATCH", url(gw, "j1"), secret=HOME1, token=job.lease_token, body=body
    )

    assert 400 == status
    assert ["progress", "cost_cents"] == [
        part.split(":")[0] for part in answer["error"]["message"].split("; ")
    ]


async def test_the_refusal_of_a_signed_request_with_a_bad_body_is_signed_for_it(
    gw: RunningGateway, http: aiohttp.ClientSession
) -> None:
    job = await leased(gw.gateway.store, "j1")
    target = url(gw, "j1", "/fail")
    data = json.dumps({"error_code": "not a code"}).encode()
    headers = worker_headers(HOME1, job.lease_token, "POST", target, data)

    async with http.post(target, data=data, headers=headers) as resp:
        status, body = resp.status, await resp.read()
        signature = resp.headers.get(push_signature.HEADER)

    key = push_signature.derive_key(HOME1, push_signature.GATEWAY_TO_WORKER)
    nonce = push_signature.request_nonce(headers[push_signature.HEADER])
    assert 400 == status
    assert push_signature.response_valid(
        key,
        push_signature.GATEWAY_TO_WORKER,
        signature,
        request_nonce=nonce,
        status=status,
        body=body,
    )


async def test_without_a_push_runtime_a_worker_route_is_unauthorized(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    config = make_config(sqlite_dsn, [upstream("u", ["http://127.0.0.1:9"], ["m"])])
    async with serving(config, run_job_loops=False) as plain:
        status, answer = await send(
            http, "POST", f"{plain.url}/v1/jobs/j1/fail", secret=HOME1, token="t",
            body={"error_code": "BOOM"},
        )  # fmt: skip

    assert (401, "UNAUTHORIZED") == (status, answer["error"]["code"])
