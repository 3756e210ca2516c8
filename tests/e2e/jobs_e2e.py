"""Real ``gpugate serve`` processes running jobs, for the job engine's end-to-end tests.

:class:`GatewayProcess` starts the real CLI on a free port with its output in a log file (a
pipe nobody reads would fill up and stall a busy gateway); ``kill()`` is ``kill -9``.
The rest submits jobs over HTTP and reads what the store and the gateway's metrics say.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Self

import aiohttp
import pytest

from e2e.children import track
from gpugate.fleet import ModelServer

GPUGATE = [sys.executable, "-m", "gpugate"]
CHAT = {"messages": [{"role": "user", "content": "hello"}]}
TERMINAL = frozenset({"completed", "failed", "cancelled"})


def write_config(path: Path, *, port: int, store: str, upstream_url: str, extra: str = "") -> Path:
    """A gateway config: one upstream serving ``qwen``, the implied ``local`` runtime."""
    path.write_text(
        f"""\
listen: 127.0.0.1:{port}
store: "{store}"
upstreams:
  - id: q0
    url: {upstream_url}
    models: [qwen]
{extra}"""
    )
    return path


class GatewayProcess:
    """One ``gpugate serve --config FILE`` subprocess; ``log`` holds its output."""

    def __init__(self, config: Path, port: int, log: Path) -> None:
        self.config = config
        self.url = f"http://127.0.0.1:{port}"
        self.log = log
        self.args = ["serve", "--config", str(config)]  # what follows `gpugate`
        self.ready_path = "/readyz"
        self._proc: asyncio.subprocess.Process | None = None

    def __repr__(self) -> str:
        state = "stopped" if self._proc is None else f"pid={self._proc.pid}"
        return f"<GatewayProcess {self.url} {state}>"

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.returncode is None

    async def start(self, http: aiohttp.ClientSession, *, within_s: float = 20) -> None:
        """Start the process and wait until ``ready_path`` (``/readyz``) answers 200."""
        with self.log.open("ab") as out:
            self._proc = track(await asyncio.create_subprocess_exec(
                *GPUGATE, *self.args,
                stdin=asyncio.subprocess.DEVNULL, stdout=out, stderr=out, env=dict(os.environ),
            ))  # fmt: skip
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline:
            if not self.alive:
                pytest.fail(f"gpugate exited early:\n{self.tail()}")
            try:
                async with http.get(self.url + self.ready_path) as resp:
                    if resp.status == 200:
                        return
            except aiohttp.ClientConnectionError:
                pass
            await asyncio.sleep(0.05)
        pytest.fail(f"gpugate did not become ready within {within_s} s:\n{self.tail()}")

    async def kill(self) -> None:
        """``kill -9``: no shutdown of any kind."""
        assert self._proc is not None
        if self._proc.returncode is None:
            self._proc.send_signal(signal.SIGKILL)
        await self._proc.wait()

    async def stop(self) -> None:
        """SIGTERM, then SIGKILL if it does not exit within 10 s."""
        if self._proc is None or self._proc.returncode is not None:
            return
        self._proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(self._proc.wait(), timeout=10)
        except TimeoutError:
            await self.kill()

    def terminate(self) -> None:
        """SIGTERM, without waiting (see :meth:`wait`)."""
        assert self._proc is not None
        self._proc.send_signal(signal.SIGTERM)

    async def wait(self, *, within_s: float) -> int:
        """The exit code, once the process has exited (fails the test after ``within_s``)."""
        assert self._proc is not None
        try:
            return await asyncio.wait_for(self._proc.wait(), timeout=within_s)
        except TimeoutError:
            pytest.fail(f"gpugate did not exit within {within_s} s:\n{self.tail()}")

    def tail(self, lines: int = 40) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])


class OpenRequestsPeak:
    """While the block runs, samples how many requests a fake model server holds open (every
    few ms); ``peak`` is the most it saw."""

    def __init__(self, server: ModelServer, every_s: float = 0.002) -> None:
        self._server = server
        self._every_s = every_s
        self._task: asyncio.Task[None] | None = None
        self.peak = 0

    async def __aenter__(self) -> Self:
        self._task = asyncio.create_task(self._sample())
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        assert self._task is not None
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)

    async def _sample(self) -> None:
        while True:
            self.peak = max(self.peak, self._server.stats.open_requests)
            await asyncio.sleep(self._every_s)


async def create_jobs(
    http: aiohttp.ClientSession,
    gateways: Sequence[str],
    slugs: Sequence[str],
    *,
    concurrency: int = 16,
) -> list[str]:
    """``POST /v1/jobs`` each slug (with an idempotency key), round robin over ``gateways``,
    at most ``concurrency`` at a time; the gateway each job was created through, in order."""
    gate = asyncio.Semaphore(concurrency)

    async def create(i: int, slug: str) -> str:
        url = gateways[i % len(gateways)]
        body = {"model": "qwen", "input": CHAT, "slug": slug}
        async with (
            gate,
            http.post(
                url + "/v1/jobs", json=body, headers={"Idempotency-Key": f"key-{slug}"}
            ) as resp,
        ):
            assert 202 == resp.status, await resp.text()
            assert slug == (await resp.json())["slug"]
        return url

    return list(await asyncio.gather(*(create(i, s) for i, s in enumerate(slugs))))


async def event_statuses(http: aiohttp.ClientSession, url: str, slug: str) -> list[str]:
    """The statuses of a job's events, oldest first, from ``GET /v1/jobs/{slug}/events``."""
    async with http.get(f"{url}/v1/jobs/{slug}/events") as resp:
        assert 200 == resp.status, await resp.text()
        return [event["status"] for event in (await resp.json())["data"]]


async def job_requests_served(http: aiohttp.ClientSession, url: str) -> int:
    """How many ``batch`` requests this gateway sent upstream (the jobs' calls: the tests send
    no synchronous ``batch`` requests), from ``gateway_requests_total`` on its ``/metrics``."""
    async with http.get(url + "/metrics") as resp:
        assert 200 == resp.status
        text = await resp.text()
    pattern = re.compile(r"^gateway_requests_total\{([^}]*)\} (\S+)$", re.MULTILINE)
    return sum(
        int(float(value))
        for labels, value in pattern.findall(text)
        if 'class="batch"' in labels and 'code="200"' in labels
    )


def trails(rows: Iterable[tuple[str, str]]) -> dict[str, list[str]]:
    """``(slug, status)`` event rows, oldest first, as each job's list of statuses."""
    by_slug: dict[str, list[str]] = {}
    for slug, status in rows:
        by_slug.setdefault(slug, []).append(status)
    return by_slug


EVENTS_SQL = (
    "SELECT j.slug, e.status FROM job_events e JOIN jobs j ON j.id = e.job_id ORDER BY e.id"
)
JOBS_SQL = "SELECT slug, state, error_code, submit_count FROM jobs"
