"""web/fast_jobs: ``POST /v1/jobs`` served by the fast path gives the ASGI route's answers.

A real gateway on loopback, once with the fast path and once with ``GPUGATE_FASTPATH=0``: the
same requests get the same statuses, bodies (but for the new job's own values) and headers
(but for the date and the request id made up), and the fast path is the one that served them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from gpugate.services.jobs import JobRequest, Jobs
from gpugate.web import fastpath
from gpugate.web.fast_jobs import JobCreation
from gpugate.web.fastpath import FastCycle
from harness import RunningGateway, connection, make_config, model_servers, serving, upstream

CHAT = {"messages": [{"role": "user", "content": "hello"}]}
JOB = {"model": "qwen", "input": CHAT}
VARYING = frozenset({"slug", "created_at", "updated_at"})  # the new job's own values


@pytest.fixture
def fast_served(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The paths :class:`JobCreation` served over a fast-path cycle."""
    served: list[str] = []
    serve = JobCreation.serve

    async def counted(self: JobCreation, cycle: FastCycle) -> None:
        served.append(cycle.path)
        await serve(self, cycle)

    monkeypatch.setattr(JobCreation, "serve", counted)
    return served


@contextlib.asynccontextmanager
async def gateway(dsn: str, **extra: Any) -> AsyncIterator[RunningGateway]:
    async with model_servers(("q0", ["qwen"])) as (server,):
        config = make_config(dsn, [upstream("q0", [server.url], ["qwen"])], **extra)
        async with serving(config, run_job_loops=False) as gw:
            yield gw


async def listed(url: str) -> list[dict[str, Any]]:
    async with aiohttp.ClientSession() as http, http.get(url + "/v1/jobs") as resp:
        jobs: list[dict[str, Any]] = (await resp.json())["data"]
        return jobs


async def answers(url: str, key: str) -> list[tuple[int, dict[str, str], Any]]:
    """A create, its replay, a reused key, a body with an unknown key, a body over the
    limit, a body that is not JSON: each answer's status, headers and JSON body."""
    requests: list[tuple[bytes, dict[str, str]]] = [
        (json.dumps(JOB).encode(), {"Idempotency-Key": key, "X-Request-Id": "r1"}),
        (json.dumps(JOB).encode(), {"Idempotency-Key": key}),
        (json.dumps({**JOB, "input": {"prompt": "other"}}).encode(), {"Idempotency-Key": key}),
        (json.dumps({**JOB, "colour": "red"}).encode(), {}),
        (json.dumps({**JOB, "input": {"pad": "x" * 5000}}).encode(), {}),
        (b"{not json", {}),
    ]
    found = []
    async with aiohttp.ClientSession() as http:
        for body, headers in requests:
            sent = {"Content-Type": "application/json", **headers}
            async with http.post(url + "/v1/jobs", data=body, headers=sent) as resp:
                raw = await resp.read()
                kept = {k.lower(): v for k, v in resp.headers.items() if k.lower() != "date"}
                found.append((resp.status, kept, json.loads(raw)))
    return found


def comparable(found: list[tuple[int, dict[str, str], Any]]) -> list[tuple[Any, ...]]:
    """The answers without what differs between two gateways: the job's slug (in an error
    message too) and times, the made-up request ids (the offered one is kept)."""
    out = []
    slug = found[0][2]["slug"]
    for status, headers, body in found:
        if "slug" in body:
            kept = {k: v for k, v in body.items() if k not in VARYING}
        else:
            kept = json.loads(json.dumps(body).replace(slug, "<slug>"))
        rid = headers.get("x-request-id")
        named = {**headers, "x-request-id": rid if rid == "r1" else "made-up"}
        out.append((status, named, kept))
    return out


async def test_post_v1_jobs_on_the_fast_path_answers_as_the_asgi_route_does(
    dsn: str, fast_served: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    limits = {"server": {"max_body_bytes": 4096}}
    async with gateway(dsn, **limits) as gw:
        fast = await answers(gw.url, "fast")
    assert ["/v1/jobs"] * 6 == fast_served
    monkeypatch.setenv(fastpath.ENVIRONMENT, "0")
    async with gateway(dsn, **limits) as gw:  # the same store: keys of its own
        asgi = await answers(gw.url, "asgi")
    assert 6 == len(fast_served)  # the second gateway served all through ASGI
    assert [202, 200, 422, 400, 413, 400] == [status for status, _, _ in fast]
    assert "IDEMPOTENCY_KEY_REUSED" == fast[2][2]["error"]["code"]
    assert "colour" in fast[3][2]["error"]["message"]
    assert "r1" == fast[0][1]["x-request-id"]
    assert comparable(asgi) == comparable(fast)


async def test_a_create_with_a_query_or_another_method_is_left_to_asgi(
    dsn: str, fast_served: list[str]
) -> None:
    async with gateway(dsn) as gw, aiohttp.ClientSession() as http:
        async with http.post(gw.url + "/v1/jobs?wait=0", json=JOB) as resp:
            waited = resp.status
        async with http.get(gw.url + "/v1/jobs") as resp:
            listed = resp.status
    assert (202, 200) == (waited, listed)
    assert [] == fast_served


async def test_a_create_whose_client_leaves_is_still_made_whole(
    dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fast path cancels a data-plane request whose client leaves; a create runs to its
    end (its owner and its job are one thing), only its answer is dropped."""
    entered, gone, release = asyncio.Event(), asyncio.Event(), asyncio.Event()
    create, lost = Jobs.create, FastCycle.lost

    async def held(self: Jobs, request: JobRequest, *, idempotency_key: str | None) -> Any:
        entered.set()
        await release.wait()
        return await create(self, request, idempotency_key=idempotency_key)

    def noticed(self: FastCycle) -> None:
        lost(self)
        gone.set()

    monkeypatch.setattr(Jobs, "create", held)
    monkeypatch.setattr(FastCycle, "lost", noticed)
    body = json.dumps(JOB).encode()
    request = b"POST /v1/jobs HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\n"
    request += b"content-length: %d\r\n\r\n%b" % (len(body), body)
    async with gateway(dsn) as gw:
        async with connection(gw) as (_, writer):
            writer.write(request)
            async with asyncio.timeout(5):
                await entered.wait()
        async with asyncio.timeout(5):
            await gone.wait()  # the server saw the client leave while the create was held
        release.set()
        async with asyncio.timeout(5):
            while not (jobs := await listed(gw.url)):
                await asyncio.sleep(0.01)
    assert ["queued"] == [job["state"] for job in jobs]
