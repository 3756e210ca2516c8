"""A gateway with two push runtimes served on loopback, for the worker routes and the worker.

``home-1`` and ``home-2`` are push runtimes (secrets ``SECRETS``), ``local`` the gateway's own
upstream runtime in front of a fake model server; the chain is ``[home-1, home-2, local]``.
:func:`leased` puts a job where a worker finds it: claimed, its runner promoted, and (unless
``recorded=False``) its call recorded, as the dispatcher leaves it after a submit.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from yarl import URL

from gpugate import push_signature
from gpugate.config import GatewayConfig
from gpugate.store import JobRecord, NewJob, Store
from gpugate.worker import Worker, WorkerSettings
from gpugate.worker.links import Links
from gpugate.worker.outbox import Outbox
from gpugate.worker.server import make_app
from harness import RunningGateway, make_config, serving, upstream

SECRETS = {"HOME1_SECRET": "secret-of-home-1", "HOME2_SECRET": "secret-of-home-2"}
CHAT = {"messages": [{"role": "user", "content": "hello"}]}


def push_config(
    dsn: str,
    model_url: str,
    *,
    urls: tuple[str, str] = ("http://127.0.0.1:9/calls", "http://127.0.0.1:9/calls"),
    jobs: dict[str, Any] | None = None,
    max_concurrency: int = 2,
) -> GatewayConfig:
    return make_config(
        dsn,
        [upstream("q0", [model_url], ["qwen"])],
        runtimes=[
            {
                "id": f"home-{n}",
                "kind": "push",
                "models": ["qwen"],
                "push": {"url": url, "secret_env": f"HOME{n}_SECRET"},
                "max_concurrency": max_concurrency,
                "budget": {"daily_cents": 1000, "cents_per_second": 0.5},
            }
            for n, url in enumerate(urls, start=1)
        ]
        + [{"id": "local", "kind": "upstream"}],
        fallback_chain=["home-1", "home-2", "local"],
        default_runtime="home-1",
        jobs=jobs or {},
    )


async def leased(
    store: Store, slug: str, runtime: str = "home-1", *, recorded: bool = True
) -> JobRecord:
    """A job claimed and submitted to ``runtime`` (the call ``call-<slug>``)."""
    await store.create_job(NewJob(slug=slug, model="qwen", input=CHAT, runner=runtime))
    job = await store.claim_job(slug, lease_s=600)
    assert job is not None
    assert job.lease_token is not None
    if recorded:
        assert await store.record_submit(
            slug,
            job.lease_token,
            runtime=runtime,
            call_id=f"call-{slug}",
            lease_s=60,
            running=False,
        )
    fresh = await store.get_job(slug)
    assert fresh is not None
    return fresh


def signed(
    secret: str,
    direction: str,
    method: str,
    url: str,
    data: bytes,
    token: str | None = None,
) -> dict[str, str]:
    """The headers of a signed push-protocol request (what the worker or the gateway sends)."""
    key = push_signature.derive_key(secret, direction)
    signature = push_signature.sign_request(
        key,
        direction,
        method=method,
        target=URL(url).raw_path_qs,
        body=data,
        lease_token=token,
        now=time.time(),
    )
    headers = {push_signature.HEADER: signature, "Content-Type": "application/json"}
    if token is not None:
        headers["X-Lease-Token"] = token
    return headers


def worker_headers(
    secret: str, token: str | None, method: str, url: str, data: bytes
) -> dict[str, str]:
    """A worker's report headers, signed with ``secret``'s worker-to-gateway key."""
    return signed(secret, push_signature.WORKER_TO_GATEWAY, method, url, data, token)


async def send(
    http: aiohttp.ClientSession,
    method: str,
    url: str,
    *,
    secret: str,
    token: str | None,
    body: dict[str, Any] | None = None,
) -> tuple[int, Any]:
    """One signed worker report; (status, JSON body)."""
    data = b"" if body is None else json.dumps(body).encode()
    headers = worker_headers(secret, token, method, url, data)
    async with http.request(method, url, data=data or None, headers=headers) as resp:
        return resp.status, await resp.json()


def held_gateway(
    dsn: str, model_url: str
) -> contextlib.AbstractAsyncContextManager[RunningGateway]:
    """The gateway of :func:`push_config`, served with its dispatcher and reaper held still:
    only the test and the worker move its jobs."""
    return serving(push_config(dsn, model_url), environ=SECRETS, run_job_loops=False)


@contextlib.asynccontextmanager
async def running_worker(
    port: int, gateway_url: str, upstream_url: str, state_dir: Path, **knobs: Any
) -> AsyncIterator[Worker]:
    """``gpugate worker`` for ``home-1``, in this process, serving /calls on ``port`` (reports
    retried every 0.05-0.5 s, so a test does not wait on the production backoff)."""
    settings = WorkerSettings(
        runtime_id="home-1",
        secret=SECRETS["HOME1_SECRET"],
        gateway_url=gateway_url,
        upstream_url=upstream_url,
        state_dir=state_dir,
        **knobs,
    )
    links = Links(gateway_url, settings.secret, upstream_url, backoff_s=0.05, max_backoff_s=0.5)
    await links.start()
    worker = Worker(settings, links, Outbox(state_dir))
    runner = web.AppRunner(make_app(worker), access_log=None)
    try:
        await worker.start()
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        yield worker
    finally:
        await runner.cleanup()
        await worker.close()
        await links.close()


async def push_call(
    http: aiohttp.ClientSession, worker_url: str, slug: str, token: str | None, secret: str = ""
) -> tuple[int, Any]:
    """What the gateway's push runtime sends for the job ``slug`` leased with ``token``."""
    body = {
        "slug": slug,
        "model": "qwen",
        "class": "batch",
        "operation": "chat/completions",
        "input": CHAT,
        "lease_token": token,
        "gateway_url": "unused",
        "deadline": None,
    }
    data = json.dumps(body).encode()
    key = secret or SECRETS["HOME1_SECRET"]
    headers = signed(key, push_signature.GATEWAY_TO_WORKER, "POST", worker_url, data)
    async with http.post(worker_url, data=data, headers=headers) as resp:
        return resp.status, await resp.json()


def gateway_headers(method: str, url: str, secret: str = "") -> dict[str, str]:
    """The headers of the gateway's bodiless request (a status poll, a cancel) to a worker."""
    key = secret or SECRETS["HOME1_SECRET"]
    return signed(key, push_signature.GATEWAY_TO_WORKER, method, url, b"")


async def until_state(store: Store, slug: str, state: str, *, within_s: float = 10.0) -> JobRecord:
    """Wait (bounded, in real time) until the job is in ``state``."""
    async with asyncio.timeout(within_s):
        while (job := await store.get_job(slug)) is None or job.state != state:
            await asyncio.sleep(0.01)
    return job
