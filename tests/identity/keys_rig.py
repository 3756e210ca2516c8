"""Replicas of ``gpugate serve`` on one PostgreSQL in ``auth.mode: keys``, and load through one
key split across them (issue #16, Done-when 2). No pytest in here: ``bench/keys.py`` uses it too.

Every part is real and on loopback: the replicas are subprocesses, the model server is the fake
fleet's, the client is aiohttp, and what the limits let through is read back from the store's
own counters (``key_counters``: requests and tokens per UTC minute and day, after settling).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import psycopg

from ports import free_port

GPUGATE = [sys.executable, "-m", "gpugate"]
TOKEN = "rig-admin-token"
MODEL = "m"


class RigError(Exception):
    """A replica did not come up."""


class KeyedReplica:
    """One ``gpugate serve`` in keys mode."""

    def __init__(
        self, workdir: Path, name: str, dsn: str, upstream_url: str, models: str = ""
    ) -> None:
        self.name = name
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = workdir / f"{name}.log"
        self.config = workdir / f"{name}.yaml"
        self.config.write_text(
            f"""\
listen: 127.0.0.1:{self.port}
store: "{dsn}"
auth: {{mode: keys}}
upstreams:
  - id: u
    url: {upstream_url}
    models: [{MODEL}]
    max_inflight: 256
{models}"""
        )
        self._proc: asyncio.subprocess.Process | None = None

    async def start(self, http: aiohttp.ClientSession, *, within_s: float = 60) -> None:
        env = {**os.environ, "GPUGATE_ADMIN_TOKEN": TOKEN}
        with self.log.open("ab") as out:
            self._proc = await asyncio.create_subprocess_exec(
                *GPUGATE, "serve", "--config", str(self.config),
                stdin=asyncio.subprocess.DEVNULL, stdout=out, stderr=out, env=env,
            )  # fmt: skip
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline:
            if self._proc.returncode is not None:
                raise RigError(f"{self.name} exited:\n{self.log.read_text()[-2000:]}")
            with contextlib.suppress(aiohttp.ClientConnectionError):
                async with http.get(self.url + "/readyz") as resp:
                    if resp.status == 200:
                        return
            await asyncio.sleep(0.05)
        raise RigError(f"{self.name} not ready within {within_s} s")

    async def stop(self) -> None:
        if self._proc is not None and self._proc.returncode is None:
            self._proc.terminate()
            try:
                await asyncio.wait_for(self._proc.wait(), timeout=30)
            except TimeoutError:
                self._proc.kill()
                await self._proc.wait()


@contextlib.asynccontextmanager
async def replicas(
    workdir: Path,
    dsn: str,
    upstream_url: str,
    http: aiohttp.ClientSession,
    *,
    count: int = 2,
    models: str = "",
) -> Any:
    """``count`` keyed replicas on one store; the first migrates it before the others start."""
    started: list[KeyedReplica] = []
    try:
        for n in range(count):
            replica = KeyedReplica(workdir, f"r{n}", dsn, upstream_url, models)
            started.append(replica)
            await replica.start(http)
        yield started
    finally:
        await asyncio.gather(*(r.stop() for r in started))


async def create_key(http: aiohttp.ClientSession, url: str, **fields: Any) -> dict[str, Any]:
    body = {"name": "load", "tenant": "team-load", **fields}
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with http.post(url + "/admin/keys", json=body, headers=headers) as resp:
        if resp.status != 201:
            raise RigError(f"key not created: {resp.status} {await resp.text()}")
        created: dict[str, Any] = await resp.json()
    return created


@dataclass
class Tally:
    """What the clients saw."""

    codes: Counter[str] = field(default_factory=Counter)
    by_replica: Counter[str] = field(default_factory=Counter)
    tokens: int = 0
    prompt: int = 0
    completion: int = 0
    latencies: list[float] = field(default_factory=list)

    @property
    def accepted(self) -> int:
        return self.codes["200"]


def prompt_of(words: int) -> dict[str, Any]:
    """A chat body whose prompt is ``words`` words (the fake server counts words as tokens)."""
    text = " ".join(f"w{n % 10}" for n in range(words))
    return {"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 16}


async def drive(
    http: aiohttp.ClientSession,
    urls: list[str],
    secret: str,
    *,
    seconds: float,
    workers: int,
    body: dict[str, Any],
) -> Tally:
    """Closed-loop workers, each on one replica in turn, for ``seconds`` (bounded)."""
    tally = Tally()
    headers = {"Authorization": f"Bearer {secret}"}
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds

    async def worker(n: int) -> None:
        url = urls[n % len(urls)]
        while loop.time() < end:
            started = loop.time()
            try:
                async with http.post(
                    url + "/v1/chat/completions", json=body, headers=headers
                ) as resp:
                    data = await resp.json()
            except aiohttp.ClientError as exc:
                tally.codes[type(exc).__name__] += 1
                continue
            if resp.status == 200:
                tally.codes["200"] += 1
                tally.by_replica[url] += 1
                tally.tokens += data["usage"]["total_tokens"]
                tally.prompt += data["usage"]["prompt_tokens"]
                tally.completion += data["usage"]["completion_tokens"]
                tally.latencies.append(loop.time() - started)
            else:
                tally.codes[data["error"]["code"]] += 1
                if resp.status == 429:  # as a client does: back off a little
                    await asyncio.sleep(0.02)

    await asyncio.gather(*(worker(n) for n in range(workers)))
    return tally


async def counters(dsn: str, key_id: str) -> dict[str, tuple[int, int, float]]:
    """The key's counters per span (``m:<minute>``, ``d:<day>``): requests, tokens, cents —
    what the replicas leased."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT span, requests, tokens, cents FROM key_counters "
            "WHERE key_id = %s AND span NOT LIKE 'c:%%' ORDER BY span",
            (key_id,),
        )
        rows = await cur.fetchall()
    return {row[0]: (int(row[1]), int(row[2]), float(row[3])) for row in rows}
