"""The at-least-once window on PostgreSQL, measured (issue #14 defect 6, Done-when 3).

Two ``gpugate serve`` replicas on one PostgreSQL; ``jobs`` jobs created through both (round
robin, each with an ``Idempotency-Key``); one replica is ``kill -9``-ed at a random point while
answers are being produced; the survivor takes its calls back and every job finishes. A
loopback proxy in front of the model server stamps each answer (by ``X-Gpugate-Job``) as it goes
back to a replica, on the same monotonic clock as the kill, so for each job executed twice the
test knows how long before the kill its first answer was produced and never committed: the
*window*. No pytest in here: ``bench/kill_window.py`` uses it too.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import psycopg
from aiohttp import web
from replicas_e2e import JOB_MODEL, MESSAGES, Replica, job_outcomes, wait_all_finished

from gpugate.fleet import ModelServer, ServerBehaviour
from ports import free_port

TIMING = "{sweep_s: 1, reap_s: 0.5, quiet_s: 2}"
"""Fast job loops: the survivor takes the dead replica's calls back within seconds."""
_COMPLETED = "SELECT count(*) FROM jobs WHERE state = 'completed'"


class StampingProxy:
    """A loopback proxy in front of the model server: ``answered[slug]`` holds the monotonic
    time of each answer it handed back for that job (by ``X-Gpugate-Job``), in order; ``peak``
    the most requests it ever had open at once."""

    def __init__(self, target: str) -> None:
        self._target = target.rstrip("/")
        self.answered: dict[str, list[float]] = {}
        self.open = 0
        self.peak = 0
        self.url = ""
        self._http: aiohttp.ClientSession | None = None

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        assert self._http is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() != "host"}
        self.open += 1
        self.peak = max(self.peak, self.open)
        try:
            async with self._http.request(
                request.method, self._target + request.path_qs, headers=headers,
                data=await request.read(),
            ) as upstream:  # fmt: skip
                body = await upstream.read()
                kept = {"Content-Type": upstream.headers.get("Content-Type", "application/json")}
        finally:
            self.open -= 1
        slug = request.headers.get("X-Gpugate-Job")
        response = web.Response(status=upstream.status, body=body, headers=kept)
        try:
            await response.prepare(request)
            await response.write_eof()
        except ConnectionError:  # the replica died meanwhile: nobody got this answer
            return response
        if slug is not None and upstream.status == 200:
            self.answered.setdefault(slug, []).append(time.monotonic())
        return response

    @contextlib.asynccontextmanager
    async def serving(self) -> AsyncIterator[StampingProxy]:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._forward)
        # A replica that dies mid-request cancels the handler, which drops the upstream request:
        # the model server sees its client go, as it would without the proxy (an aborted
        # request is no execution, as vLLM aborts a request whose client left).
        runner = web.AppRunner(app, handler_cancellation=True)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        self.url = f"http://127.0.0.1:{port}"
        async with aiohttp.ClientSession() as self._http:
            try:
                yield self
            finally:
                await runner.cleanup()


@dataclass
class KillRun:
    """One run's figures: what was lost, what ran twice, and why each job ran twice — its first
    answer reached the killed replica ``windows_ms`` before the kill and was never committed
    (the at-least-once window), or it was still in flight at the kill (the model server
    finished it for a replica already dead: run again by design)."""

    jobs: int
    killed_after: int  # completed jobs (in the store) when the kill was sent
    lost: int
    completed_twice: int
    executed_twice: int
    windows_ms: list[float] = field(default_factory=list)
    in_flight: int = 0
    finished_s: float = 0.0

    @property
    def max_window_ms(self) -> float:
        return max(self.windows_ms, default=0.0)

    def summary(self) -> str:
        windows = ", ".join(f"{w:.1f}" for w in sorted(self.windows_ms)) or "-"
        return (
            f"{self.jobs} jobs, kill -9 after {self.killed_after} completed: lost {self.lost}, "
            f"completed twice {self.completed_twice}, executed twice {self.executed_twice}: "
            f"{self.in_flight} in flight at the kill, {len(self.windows_ms)} answered "
            f"{windows} ms before it and not committed; all done {self.finished_s:.1f} s after"
        )


async def create(http: aiohttp.ClientSession, urls: list[str], slug: str) -> None:
    """``POST /v1/jobs`` to the first replica, resent (same key) to the next on a failure."""
    body = {"model": JOB_MODEL, "input": {"messages": MESSAGES}, "slug": slug}
    for attempt in range(6):
        url = urls[attempt % len(urls)]
        with contextlib.suppress(aiohttp.ClientError):
            async with http.post(
                url + "/v1/jobs", json=body, headers={"Idempotency-Key": f"key-{slug}"}
            ) as resp:
                if resp.status in (200, 202):
                    return
        await asyncio.sleep(0.05 * (attempt + 1))
    raise AssertionError(f"job {slug} could not be created")


async def completed(dsn: str) -> int:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        row = await (await conn.execute(_COMPLETED)).fetchone()
    return int(row[0]) if row else 0


async def kill_run(
    workdir: Path,
    http: aiohttp.ClientSession,
    dsn: str,
    *,
    jobs: int,
    rng: random.Random,
    within_s: float = 120,
) -> KillRun:
    """One run on a fresh ``dsn``: two replicas, ``jobs`` jobs, a kill -9 of the first replica
    once a random share (20-70 %) of the jobs has completed."""
    behaviour = ServerBehaviour(delay_s=0.005)
    async with (
        ModelServer(["unused"], name="q0") as chat,
        ModelServer([JOB_MODEL], name="q1", behaviour=behaviour) as fleet,
        StampingProxy(fleet.url).serving() as proxy,
    ):
        replicas = [
            Replica(workdir, f"k{i}", dsn, chat.url, proxy.url, timing=TIMING) for i in range(2)
        ]
        try:
            for replica in replicas:
                await replica.start(http)
            slugs = [f"w-{i:04d}" for i in range(jobs)]
            at = int(jobs * rng.uniform(0.2, 0.7))
            gate = asyncio.Semaphore(32)

            async def one(i: int, slug: str) -> None:
                async with gate:
                    urls = [r.url for r in replicas]
                    await create(http, urls[i % 2 :] + urls[: i % 2], slug)

            creating = asyncio.gather(*(one(i, s) for i, s in enumerate(slugs)))
            deadline = time.monotonic() + within_s
            while (done := await completed(dsn)) < at:
                assert time.monotonic() < deadline, f"only {done} of {at} completed in time"
                await asyncio.sleep(rng.uniform(0.001, 0.02))
            killed_at = time.monotonic()
            await replicas[0].kill()
            await creating  # the survivor takes the creates the dead one no longer answers
            finished_s = await wait_all_finished(dsn, within_s=within_s)
        finally:
            for replica in replicas:
                if replica.alive:
                    await replica.kill()
        executions = dict(fleet.stats.executions)
    outcomes = await job_outcomes(dsn, slugs)
    twice = [slug for slug in slugs if executions.get(slug, 0) > 1]
    before = [killed_at - proxy.answered.get(slug, [killed_at])[0] for slug in twice]
    windows = [seconds * 1000 for seconds in before if seconds > 0]
    return KillRun(
        jobs, done, outcomes.lost, outcomes.duplicated, len(twice), windows,
        len(twice) - len(windows), finished_s,
    )  # fmt: skip
