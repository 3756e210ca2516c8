"""Replicas on one PostgreSQL behind nginx, under a steady mix of load (issue #20).

The rig of ``tests/e2e/test_replicas*.py`` and ``bench/replicas.py``; no pytest in here, so the
bench can use it too. Every part is real and on loopback:

* :class:`Nginx` — Debian's nginx, round robin over the replicas, passive health
  (``max_fails=1 fail_timeout=2s``; a refused connect goes to the next replica), unbuffered, one
  connection per request to the replicas (a reused connection the replica closes at shutdown
  would fail a POST nginx may not resend). Its access log names, per request id, the replica
  that held the request and what it answered, so a failure can be pinned on a replica.
* :class:`Replica` — one ``gpugate serve`` subprocess (its output in a log file).
* :class:`Load` — the mix: closed-loop chat completions and SSE streams through the real
  ``openai`` client, and jobs created with an ``Idempotency-Key`` (resent on failure, as a
  client does), every request tagged ``X-Request-Id``.
* :func:`job_outcomes` — what the store says of every job created: lost, duplicated, done.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Self

import aiohttp
import openai
import psycopg

from e2e.children import track
from ports import free_port

GPUGATE = [sys.executable, "-m", "gpugate"]
NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
MODEL = "qwen"  # chat and streams
JOB_MODEL = "qwen-jobs"  # jobs: served by a slower model server, so jobs are in flight
MESSAGES = [{"role": "user", "content": "hello"}]


class RigError(Exception):
    """A part of the rig did not come up or go down as it should."""


# -- nginx ----------------------------------------------------------------------------------


def nginx_config(
    workdir: Path, port: int, backends: Sequence[int], down: frozenset[int] = frozenset()
) -> str:
    servers = "".join(
        f"        server 127.0.0.1:{p} max_fails=1 fail_timeout=2s{' down' if p in down else ''};\n"
        for p in backends
    )
    return f"""daemon off;
worker_processes 1;
pid {workdir}/nginx.pid;
error_log {workdir}/nginx-error.log warn;
events {{ worker_connections 4096; }}
http {{
    log_format replicas '$http_x_request_id $upstream_addr $status $upstream_status';
    access_log {workdir}/nginx-access.log replicas;
    client_body_temp_path {workdir}/nginx-body;
    proxy_temp_path {workdir}/nginx-proxy;
    upstream gateways {{
{servers}    }}
    server {{
        listen 127.0.0.1:{port} backlog=4096;
        location / {{
            proxy_pass http://gateways;
            proxy_http_version 1.1;
            proxy_buffering off;
            proxy_request_buffering off;
            proxy_read_timeout 60s;
            proxy_next_upstream error timeout;
            proxy_next_upstream_tries 3;
        }}
    }}
}}
"""


class Nginx:
    """nginx in front of the replicas' ports, on its own free port."""

    def __init__(self, workdir: Path, backends: Sequence[int]) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.backends = list(backends)
        self.conf = workdir / "nginx.conf"
        self.conf.write_text(nginx_config(workdir, self.port, backends))
        self._proc: subprocess.Popen[bytes] | None = None

    def note(self, event: str) -> None:
        """One line of the rig's own log (rig.log), timed like nginx's error log."""
        with (self.workdir / "rig.log").open("a") as log:
            now = time.time()
            log.write(f"{time.strftime('%Y/%m/%d %H:%M:%S', time.localtime(now))}.")
            log.write(f"{int(now * 1000) % 1000:03d} {event}\n")

    def route(self, *, down: frozenset[int] = frozenset()) -> None:
        """Send no new request to the ``down`` ports (what an endpoints controller does with a
        pod whose readiness fails): rewrite the config and reload; requests in flight, streams
        included, finish on the old workers."""
        assert self._proc is not None
        self.conf.write_text(nginx_config(self.workdir, self.port, self.backends, down))
        self._proc.send_signal(signal.SIGHUP)

    async def start(self, http: aiohttp.ClientSession) -> None:
        if not Path(NGINX).exists():
            raise RigError("nginx is not installed (apt-get install nginx-light)")
        with (self.workdir / "nginx-stderr.log").open("ab") as err:
            self._proc = track(
                subprocess.Popen(
                    [NGINX, "-c", str(self.conf), "-p", str(self.workdir), "-e", "stderr"],
                    stdout=subprocess.DEVNULL,
                    stderr=err,
                )
            )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with contextlib.suppress(aiohttp.ClientError):
                async with http.get(self.url + "/healthz") as resp:
                    if resp.status < 500:
                        return
            await asyncio.sleep(0.05)
        raise RigError("nginx did not answer within 10 s")

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGQUIT)  # graceful
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()

    def held_by(self) -> dict[str, tuple[str, str]]:
        """Request id -> (the replica address that held it last, the status nginx sent)."""
        seen: dict[str, tuple[str, str]] = {}
        log = self.workdir / "nginx-access.log"
        for line in log.read_text().splitlines() if log.exists() else []:
            rid, upstreams, status, _ = ([*line.split(" ", 3), "", "", ""])[:4]
            seen[rid] = (upstreams.split(", ")[-1], status)
        return seen


# -- replicas -------------------------------------------------------------------------------


TEST_TIMING = "{sweep_s: 5, reap_s: 2, quiet_s: 10}"
"""The job loops' timing in the tests: a dead replica's calls are taken back within seconds."""


def replica_config(
    path: Path,
    *,
    port: int,
    dsn: str,
    name: str,
    upstream_url: str,
    jobs_url: str,
    timing: str = TEST_TIMING,
) -> Path:
    joiner = "&" if "?" in dsn else "?"
    path.write_text(
        f"""\
listen: 127.0.0.1:{port}
store: "{dsn}{joiner}application_name={name}"
upstreams:
  - id: q0
    url: {upstream_url}
    models: [{MODEL}]
    max_inflight: 256
  - id: q1
    url: {jobs_url}
    models: [{JOB_MODEL}]
    max_inflight: 256
jobs: {timing}
server: {{drain_delay_s: 2, shutdown_grace_s: 10}}
"""
    )
    return path


class Replica:
    """One ``gpugate serve`` on a fixed port (a restart comes back on the same one)."""

    def __init__(
        self,
        workdir: Path,
        name: str,
        dsn: str,
        upstream_url: str,
        jobs_url: str,
        *,
        timing: str = TEST_TIMING,
    ) -> None:
        self.name = name
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.url = f"http://{self.address}"
        self.log = workdir / f"{name}.log"
        self.config = replica_config(
            workdir / f"{name}.yaml",
            port=self.port,
            dsn=dsn,
            name=name,
            upstream_url=upstream_url,
            jobs_url=jobs_url,
            timing=timing,
        )
        self._proc: asyncio.subprocess.Process | None = None
        self._terminated = False

    @property
    def pid(self) -> int:
        assert self._proc is not None
        return self._proc.pid

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.returncode is None

    async def start(self, http: aiohttp.ClientSession, *, within_s: float = 30) -> None:
        with self.log.open("ab") as out:
            self._proc = track(await asyncio.create_subprocess_exec(
                *GPUGATE, "serve", "--config", str(self.config),
                stdin=asyncio.subprocess.DEVNULL, stdout=out, stderr=out, env=dict(os.environ),
            ))  # fmt: skip
        self._terminated = False
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline:
            if not self.alive:
                raise RigError(f"{self.name} exited early:\n{self.tail()}")
            with contextlib.suppress(aiohttp.ClientConnectionError):
                async with http.get(self.url + "/readyz") as resp:
                    if resp.status == 200:
                        return
            await asyncio.sleep(0.05)
        raise RigError(f"{self.name} not ready within {within_s} s:\n{self.tail()}")

    def terminate(self) -> None:
        """SIGTERM, once, without waiting (:meth:`stop` waits). Once only: a second signal tells
        gpugate to stop accepting at once, cutting its drain short."""
        assert self._proc is not None
        if self._proc.returncode is None and not self._terminated:
            self._terminated = True
            self._proc.send_signal(signal.SIGTERM)

    async def draining(self, http: aiohttp.ClientSession) -> bool:
        """Whether ``/readyz`` says 503 (or nothing answers any more)."""
        try:
            async with http.get(self.url + "/readyz") as resp:
                return resp.status == 503
        except aiohttp.ClientConnectionError:
            return True

    async def stop(self, *, within_s: float = 30) -> int:
        """SIGTERM and wait: the exit code (a RigError if it does not exit in time)."""
        assert self._proc is not None
        self.terminate()
        try:
            return await asyncio.wait_for(self._proc.wait(), timeout=within_s)
        except TimeoutError as exc:
            raise RigError(f"{self.name} did not exit within {within_s} s") from exc

    async def kill(self) -> None:
        """``kill -9``."""
        assert self._proc is not None
        if self._proc.returncode is None:
            self._proc.send_signal(signal.SIGKILL)
        await self._proc.wait()

    async def inflight(self, http: aiohttp.ClientSession, upstream: str) -> int:
        """Requests this replica has in flight on ``upstream`` now (its ``/metrics``)."""
        async with http.get(self.url + "/metrics") as resp:
            text = await resp.text()
        found = re.search(
            rf'^gateway_upstream_inflight{{upstream="{upstream}"}} (\S+)$', text, re.MULTILINE
        )
        return int(float(found[1])) if found else 0

    def tail(self, lines: int = 30) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])


async def roll(replica: Replica, nginx: Nginx, http: aiohttp.ClientSession) -> int:
    """Restart one replica the way a Deployment rolls a pod behind a Service: SIGTERM; once its
    readiness fails, no new requests are routed to it (it keeps serving through its drain
    delay meanwhile); it exits; it starts again; once ready, it is routed to again. The exit
    code of the stopped process."""
    nginx.note(f"SIGTERM {replica.name}")
    replica.terminate()
    deadline = time.monotonic() + 10
    while not await replica.draining(http):
        if time.monotonic() > deadline:
            raise RigError(f"{replica.name}: /readyz still 200 10 s after SIGTERM")
        await asyncio.sleep(0.1)  # a readiness probe's period
    nginx.note(f"{replica.name} not ready: routed out")
    nginx.route(down=frozenset({replica.port}))
    code = await replica.stop()
    nginx.note(f"{replica.name} exited {code}")
    await replica.start(http)
    nginx.route()
    nginx.note(f"{replica.name} ready: routed in")
    return code


# -- load -----------------------------------------------------------------------------------


@dataclass
class Tally:
    """What the clients saw."""

    chats_ok: int = 0
    streams_ok: int = 0
    jobs_created: int = 0
    job_resends: int = 0  # POST /v1/jobs sent again after a failure (same Idempotency-Key)
    failures: list[tuple[str, str, str]] = field(default_factory=list)  # (kind, request id, why)
    slugs: list[str] = field(default_factory=list)

    def failed(self, kind: str) -> int:
        return sum(1 for k, _, _ in self.failures if k == kind)

    @property
    def requests(self) -> int:
        return self.chats_ok + self.streams_ok + self.jobs_created + len(self.failures)

    def summary(self) -> str:
        return (
            f"chat ok {self.chats_ok} failed {self.failed('chat')} · "
            f"streams ok {self.streams_ok} broken {self.failed('stream')} · "
            f"jobs created {self.jobs_created} (submit failures {self.failed('job')}, "
            f"resent {self.job_resends})"
        )


class Load:
    """A steady mix through ``url`` until stopped: ``chats`` + ``streams`` closed-loop clients
    and one job creator at ``jobs_per_s``."""

    def __init__(
        self, url: str, *, chats: int = 3, streams: int = 2, jobs_per_s: float = 15
    ) -> None:
        self.url = url
        self.tally = Tally()
        self._chats = chats
        self._streams = streams
        self._jobs_every_s = 1 / jobs_per_s if jobs_per_s > 0 else 0.0
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        # One connection per request to the balancer: an nginx reload (a replica routed out or
        # back) closes idle client connections, and a POST meeting one fails in a client that
        # does not retry (max_retries=0 here). That is the balancer's doing; this measures the
        # replicas'.
        self._client = openai.AsyncOpenAI(
            base_url=url + "/v1",
            api_key="none",
            max_retries=0,
            timeout=30,
            default_headers={"Connection": "close"},
        )
        self._http: aiohttp.ClientSession | None = None
        self._job_tasks: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> Self:
        self._http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True))
        self._tasks = [asyncio.create_task(self._chat_loop()) for _ in range(self._chats)]
        self._tasks += [asyncio.create_task(self._stream_loop()) for _ in range(self._streams)]
        if self._jobs_every_s:
            self._tasks.append(asyncio.create_task(self._job_loop()))
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await asyncio.gather(*self._job_tasks, return_exceptions=True)
        await self._client.close()
        if self._http is not None:
            await self._http.close()

    async def _chat_loop(self) -> None:
        while not self._stop.is_set():
            rid = uuid.uuid4().hex
            try:
                reply = await self._client.chat.completions.create(
                    model=MODEL, messages=MESSAGES, extra_headers={"X-Request-Id": rid}
                )  # type: ignore[call-overload]
                if reply.choices:
                    self.tally.chats_ok += 1
                else:
                    self.tally.failures.append(("chat", rid, "no choices"))
            except openai.OpenAIError as exc:
                self.tally.failures.append(("chat", rid, f"{type(exc).__name__}: {exc}"[:200]))

    async def _stream_loop(self) -> None:
        while not self._stop.is_set():
            rid = uuid.uuid4().hex
            finished = False
            try:
                stream = await self._client.chat.completions.create(
                    model=MODEL,
                    messages=MESSAGES,
                    stream=True,
                    extra_headers={"X-Request-Id": rid},
                )  # type: ignore[call-overload]
                async for chunk in stream:
                    if chunk.choices and chunk.choices[0].finish_reason:
                        finished = True
            except (openai.OpenAIError, aiohttp.ClientError) as exc:
                self.tally.failures.append(("stream", rid, f"{type(exc).__name__}: {exc}"[:200]))
                continue
            if finished:
                self.tally.streams_ok += 1
            else:
                self.tally.failures.append(("stream", rid, "ended without finish_reason"))

    async def _job_loop(self) -> None:
        n = 0
        while not self._stop.is_set():
            n += 1
            task = asyncio.create_task(self._create_job(f"r-{uuid.uuid4().hex[:12]}-{n}"))
            self._job_tasks.add(task)
            task.add_done_callback(self._job_tasks.discard)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), self._jobs_every_s)

    async def _create_job(self, slug: str) -> None:
        assert self._http is not None
        body = {"model": JOB_MODEL, "input": {"messages": MESSAGES}, "slug": slug}
        for attempt in range(5):
            rid = uuid.uuid4().hex
            headers = {"Idempotency-Key": f"key-{slug}", "X-Request-Id": rid}
            try:
                async with self._http.post(self.url + "/v1/jobs", json=body, headers=headers) as r:
                    if r.status in (200, 202):
                        self.tally.jobs_created += 1
                        self.tally.slugs.append(slug)
                        return
                    why = f"HTTP {r.status}: {(await r.text())[:120]}"
            except aiohttp.ClientError as exc:
                why = f"{type(exc).__name__}: {exc}"[:200]
            self.tally.failures.append(("job", rid, why))
            self.tally.job_resends += 1
            await asyncio.sleep(0.2 * (attempt + 1))


# -- the store's word -----------------------------------------------------------------------


@dataclass(frozen=True)
class JobOutcomes:
    """Every job created, as the store has it."""

    states: Counter[str]
    completions: dict[str, int]  # slug -> how many `completed` events it has
    missing: list[str]  # created (the client got 2xx) but not in the store
    errors: dict[str, str]  # slug -> "CODE: message" of each job not completed

    @property
    def lost(self) -> int:
        not_done = sum(n for state, n in self.states.items() if state != "completed")
        return len(self.missing) + not_done

    @property
    def duplicated(self) -> int:
        return sum(1 for n in self.completions.values() if n > 1)

    def summary(self) -> str:
        return f"jobs: {dict(self.states)} · lost {self.lost} · completed twice {self.duplicated}"


_OUTCOMES = """
SELECT j.slug, j.state, count(e.id) FILTER (WHERE e.status = 'completed'),
       j.error_code || ': ' || coalesce(j.error_message, ''),
       string_agg(e.status || coalesce('/' || e.error_code, '') || '@' || e.actor, ' '
                  ORDER BY e.id)
FROM jobs j LEFT JOIN job_events e ON e.job_id = j.id
WHERE j.slug = ANY(%s) GROUP BY j.slug, j.state, j.error_code, j.error_message"""
_UNFINISHED = "SELECT count(*) FROM jobs WHERE state NOT IN ('completed', 'failed', 'cancelled')"


async def job_outcomes(dsn: str, slugs: Sequence[str]) -> JobOutcomes:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        rows = await (await conn.execute(_OUTCOMES, [list(slugs)])).fetchall()
    found = {row[0] for row in rows}
    return JobOutcomes(
        Counter(row[1] for row in rows),
        {row[0]: row[2] for row in rows},
        [s for s in slugs if s not in found],
        {row[0]: f"{row[3]} [{row[4]}]" for row in rows if row[1] != "completed"},
    )


async def wait_all_finished(dsn: str, *, within_s: float) -> float:
    """Seconds until no job is left unfinished (a RigError after ``within_s``)."""
    started = time.monotonic()
    while True:
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            row = await (await conn.execute(_UNFINISHED)).fetchone()
        if row is not None and row[0] == 0:
            return time.monotonic() - started
        if time.monotonic() - started > within_s:
            raise RigError(f"{row[0] if row else '?'} jobs unfinished after {within_s} s")
        await asyncio.sleep(0.2)


_CLAIMS_OF = "SELECT count(*) FROM jobs WHERE state = 'dispatching' AND leased_by LIKE %s"
_RESCUED = """
SELECT count(DISTINCT e.job_id) FROM job_events e WHERE e.status = 'rescued' AND e.at >= %s"""


async def claims_released(dsn: str, pid: int, *, within_s: float) -> float:
    """Seconds until no dispatcher claim of the replica process ``pid`` is left (its replica id
    holds the pid); a RigError after ``within_s``."""
    started = time.monotonic()
    while True:
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            row = await (await conn.execute(_CLAIMS_OF, [f"%-dispatcher@%-{pid}-%"])).fetchone()
        if row is not None and row[0] == 0:
            return time.monotonic() - started
        if time.monotonic() - started > within_s:
            raise RigError(f"{row[0] if row else '?'} claims of pid {pid} left after {within_s} s")
        await asyncio.sleep(0.2)


async def rescued_since(dsn: str, since: datetime) -> int:
    """Jobs the reaper took back (event ``rescued``) since ``since``: calls a dead replica held."""
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        row = await (await conn.execute(_RESCUED, [since])).fetchone()
    return int(row[0]) if row else 0
