"""The proxy benchmark's load: what is sent, and the clients that send it and time the answers.

wrk for throughput (its output parsed into a :class:`Load`); paced bursts on raw keep-alive
connections (``httptools``, so the client's own cost is the same few µs for every target); and
three Python clients on aiohttp: an open loop at a fixed rate for added latency, slow streams
for time to first byte, and long streams held open at once for memory.
"""

from __future__ import annotations

import asyncio
import math
import os
import re
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import aiohttp
import httptools
from proxy_targets import CHAT, EMBEDDINGS, HERE, SLOW, BenchError, cpu_s, dumps

MIXES = {"chat": ("json", CHAT), "embeddings": ("json", EMBEDDINGS), "sse": ("sse", CHAT)}
JSON_HEADERS = {"Content-Type": "application/json"}
RATE = 500.0  # requests/s of the added-latency clients
BURST = 64  # connections of the paced-burst client: each burst is one request on each


# -- what is sent -------------------------------------------------------------------------------


def _request(model: str, *, stream: bool = False) -> bytes:
    messages = [
        {"role": "system", "content": "You are a concise assistant."},
        {"role": "user", "content": "Why do keep-alive connections make proxies faster?"},
    ]
    doc: dict[str, object] = {"model": model, "messages": messages, "max_tokens": 128}
    return dumps({**doc, "stream": True} if stream else doc)


BODIES = {
    "chat": _request("json-model"),
    "embeddings": dumps({"model": "emb-model", "input": "The quick brown fox jumps."}),
    "sse": _request("sse-model", stream=True),
    "slow": _request("slow-model", stream=True),
    "long": _request("long-model", stream=True),
}


# -- throughput: wrk ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Load:
    """One wrk run against one target."""

    rps: float
    p50_ms: float
    p99_ms: float
    requests: int
    non_2xx: int
    socket_errors: int
    cpu_us: float  # CPU of the target's process(es) per request


_UNITS_MS = {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60_000.0}


def parse_wrk(text: str, cpu: float) -> Load:
    """A :class:`Load` from wrk's output and the CPU seconds the target spent meanwhile."""

    def find(pattern: str) -> re.Match[str]:
        if (match := re.search(pattern, text, re.MULTILINE)) is None:
            raise BenchError(f"no {pattern!r} in wrk's output:\n{text}")
        return match

    p50, p99 = (find(rf"^\s+{q}%\s+([\d.]+)(us|ms|s|m)\s*$") for q in (50, 99))
    total = int(find(r"(\d+) requests in")[1])
    non_2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", text)
    sockets = re.search(
        r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", text
    )
    return Load(
        rps=float(find(r"Requests/sec:\s+([\d.]+)")[1]),
        p50_ms=float(p50[1]) * _UNITS_MS[p50[2]],
        p99_ms=float(p99[1]) * _UNITS_MS[p99[2]],
        requests=total,
        non_2xx=int(non_2xx[1]) if non_2xx else 0,
        socket_errors=sum(int(n) for n in sockets.groups()) if sockets else 0,
        cpu_us=cpu / max(total, 1) * 1e6,
    )


def run_wrk(
    wrk: str, url: str, body: bytes, duration: int, pid: int, *, bearer: str | None = None
) -> Load:
    """``wrk -t1 -c64 --latency`` POSTing ``body`` (bench/post.lua), with ``Authorization:
    Bearer <bearer>`` when given; the target's CPU is read around the run."""
    argv = [wrk, "-t1", "-c64", f"-d{duration}s", "--latency", "-s", str(HERE / "post.lua"), url]
    env = {**os.environ, "BENCH_BODY": body.decode()}
    if bearer is not None:
        env["BENCH_BEARER"] = bearer
    cpu_before = cpu_s(pid)
    done = subprocess.run(
        argv, capture_output=True, text=True, env=env, timeout=duration + 60, check=False
    )
    if done.returncode != 0:
        raise BenchError(f"wrk failed ({done.returncode}): {done.stderr or done.stdout}")
    return parse_wrk(done.stdout, cpu_s(pid) - cpu_before)


def run_wrk_at_once(
    wrk: str, body: bytes, duration: int, *targets: tuple[str, int, str | None]
) -> list[Load]:
    """:func:`run_wrk` against each of ``targets`` (url, pid, bearer) **at the same time**, a
    wrk each. Targets pinned to one core then share it: each always has requests waiting, so
    the scheduler gives each its part of the core, and the ratio of their req/s is the inverse
    ratio of what a request costs each, measured in one window (a shared machine's req/s moves
    by 20-40 % between runs seconds apart; runs one after the other mostly measure that)."""
    with ThreadPoolExecutor(max_workers=len(targets)) as pool:
        runs = [
            pool.submit(run_wrk, wrk, url, body, duration, pid, bearer=bearer)
            for url, pid, bearer in targets
        ]
        return [run.result() for run in runs]


# -- the Python clients: open-loop latency, slow streams, held streams --------------------------


def pct(values: list[float], q: float) -> float:
    """The ``q``-th percentile by nearest rank (NaN when there is nothing)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def _session(timeout: aiohttp.ClientTimeout) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout)


@dataclass
class OpenLoop:
    """Non-streaming requests sent at a fixed rate, whatever the answers do."""

    latency_ms: list[float] = field(default_factory=list)
    overhead_ms: list[float] = field(default_factory=list)  # gpugate's X-Gateway-Overhead-Ms
    late_ms: list[float] = field(default_factory=list)  # how late the client sent each one
    sent_rps: float = 0.0
    errors: int = 0


async def _timed(session: aiohttp.ClientSession, url: str, body: bytes, into: OpenLoop) -> None:
    started = time.perf_counter()
    try:
        async with session.post(url, data=body, headers=JSON_HEADERS) as resp:
            await resp.read()
            elapsed_ms = (time.perf_counter() - started) * 1000
    except (aiohttp.ClientError, TimeoutError):
        into.errors += 1
        return
    if resp.status != 200:
        into.errors += 1
        return
    into.latency_ms.append(elapsed_ms)
    if (overhead := resp.headers.get("x-gateway-overhead-ms")) is not None:
        into.overhead_ms.append(float(overhead))


async def open_loop(url: str, body: bytes, rate: float, duration: float) -> OpenLoop:
    """Send at ``rate`` for ``duration`` s, after 0.5 s of the same that is not counted."""
    loop = asyncio.get_running_loop()
    async with _session(aiohttp.ClientTimeout(total=10)) as session:
        for seconds in (0.5, duration):
            result, tasks = OpenLoop(), []
            count = max(2, round(rate * seconds))
            start = loop.time() + 0.01
            for i in range(count):
                due = start + i / rate
                if (wait := due - loop.time()) > 0:
                    await asyncio.sleep(wait)
                result.late_ms.append((loop.time() - due) * 1000)
                tasks.append(asyncio.create_task(_timed(session, url, body, result)))
            result.sent_rps = (count - 1) / max(loop.time() - start, 1e-9)
            await asyncio.gather(*tasks)
    return result


@dataclass
class Bursts:
    """Bursts of one request per connection, all written at once, at a fixed pace."""

    latency_ms: list[float] = field(default_factory=list)  # from the burst's start to the end
    late_ms: list[float] = field(default_factory=list)  # how late each burst began
    bursts: int = 0
    busy: int = 0  # connections still busy with the previous burst's answer (none sent)
    errors: int = 0
    sent: int = 0  # requests written, the warm-up's included (for the CPU per request)


class _BurstConn(asyncio.Protocol):
    """One keep-alive connection of the burst client; one request at a time."""

    def __init__(self, into: Bursts) -> None:
        self.into = into
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.sent_at: float | None = None  # None: idle
        self.counted = True
        self.lost = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.into.errors += 1
            if self.transport is not None:
                self.transport.close()

    def on_message_complete(self) -> None:
        if self.sent_at is not None and self.counted:
            if self.parser.get_status_code() == 200:
                self.into.latency_ms.append((time.perf_counter() - self.sent_at) * 1000)
            else:
                self.into.errors += 1
        self.sent_at = None

    def connection_lost(self, exc: Exception | None) -> None:  # noqa: ARG002
        if self.sent_at is not None:
            self.into.errors += 1
        self.transport, self.sent_at = None, None
        if not self.lost.done():
            self.lost.set_result(None)


async def paced_bursts(url: str, body: bytes, conns: int, rate: float, duration: float) -> Bursts:
    """Every ``conns / rate`` s, write one request on each of ``conns`` connections at once
    (the last answer of a burst waits for the other ``conns - 1``); 0.5 s of warm-up first."""
    loop = asyncio.get_running_loop()
    host, _, rest = url.removeprefix("http://").partition("/")
    name, _, port = host.partition(":")
    request = (
        f"POST /{rest} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    result = Bursts()
    clients = []
    for _ in range(conns):
        _, client = await loop.create_connection(lambda: _BurstConn(result), name, int(port))
        clients.append(client)
    interval = conns / rate
    warmup = max(1, round(0.5 / interval))
    count = warmup + max(2, round(duration / interval))
    start = time.perf_counter() + 0.01
    try:
        for k in range(count):
            due = start + k * interval
            if (wait := due - time.perf_counter()) > 0:
                await asyncio.sleep(wait)
            began = time.perf_counter()
            counted = k >= warmup
            if counted:
                result.late_ms.append((began - due) * 1000)
                result.bursts += 1
            for client in clients:
                if client.transport is None:
                    result.errors += counted
                elif client.sent_at is not None:
                    result.busy += counted
                else:
                    client.sent_at, client.counted = began, counted
                    client.transport.write(request)
                    result.sent += 1
        deadline = time.perf_counter() + 10
        while any(c.sent_at is not None for c in clients) and time.perf_counter() < deadline:
            await asyncio.sleep(0.005)
        result.errors += sum(c.sent_at is not None for c in clients)
    finally:
        for client in clients:
            if client.transport is not None:
                client.transport.close()
    return result


@dataclass
class Streams:
    """Streams run by a fixed number of clients, each one stream after another."""

    ttfb_ms: list[float] = field(default_factory=list)
    errors: int = 0


async def _one_stream(session: aiohttp.ClientSession, url: str, body: bytes) -> float | None:
    """Time to the first body byte (ms) of one stream read to its end; None if it failed."""
    started = time.perf_counter()
    try:
        async with session.post(url, data=body, headers=JSON_HEADERS) as resp:
            first = await resp.content.readany()
            ttfb_ms = (time.perf_counter() - started) * 1000
            while await resp.content.readany():
                pass
    except (aiohttp.ClientError, TimeoutError):
        return None
    return ttfb_ms if resp.status == 200 and first else None


async def slow_streams(
    url: str, body: bytes, clients: int, warmup_s: float, duration: float
) -> Streams:
    """``clients`` loops streaming one answer after another, started spread over a stream's
    length; streams begun in the warm-up or after ``duration`` are not counted."""
    loop = asyncio.get_running_loop()
    counted_from = loop.time() + warmup_s
    deadline = counted_from + duration
    result = Streams()

    async def client(session: aiohttp.ClientSession, offset: float) -> None:
        await asyncio.sleep(offset)
        while (began := loop.time()) < deadline:
            ttfb_ms = await _one_stream(session, url, body)
            if began < counted_from:
                continue
            if ttfb_ms is None:
                result.errors += 1
            else:
                result.ttfb_ms.append(ttfb_ms)

    spread = SLOW[0] * (SLOW[1] + 1) if warmup_s else duration / 2
    async with _session(aiohttp.ClientTimeout(total=30)) as session:
        await asyncio.gather(*(client(session, i * spread / clients) for i in range(clients)))
    return result


@dataclass
class Held:
    """Long streams opened at once, held until each had its first chunk, then closed."""

    count: int
    opened: int = 0
    failed: int = 0
    open_s: float = math.nan  # until every stream had its first chunk
    rss_mb: float = math.nan  # of the proxy, with the streams open
    left_open: int = 0  # streams the upstream still served 5 s after the clients closed


async def hold_streams(
    url: str, body: bytes, count: int, read_rss: Callable[[], float], stats_url: str
) -> Held:
    """Open ``count`` long streams at once; when each has its first chunk (or after 60 s) read
    the RSS and close them all; then count the streams the upstream still serves."""
    loop = asyncio.get_running_loop()
    held, ready, release = Held(count), asyncio.Event(), asyncio.Event()

    def tally(*, ok: bool) -> None:
        held.opened += ok
        held.failed += not ok
        if held.opened + held.failed == count:
            ready.set()

    async def hold(session: aiohttp.ClientSession) -> None:
        counted = False
        try:
            async with session.post(url, data=body, headers=JSON_HEADERS) as resp:
                tally(ok=resp.status == 200 and bool(await resp.content.readany()))
                counted = True
                await release.wait()
                resp.close()
        except (aiohttp.ClientError, TimeoutError):
            if not counted:
                tally(ok=False)

    started = loop.time()
    async with _session(aiohttp.ClientTimeout(sock_connect=30, sock_read=30)) as session:
        tasks = [asyncio.create_task(hold(session)) for _ in range(count)]
        await asyncio.wait([asyncio.create_task(ready.wait())], timeout=60)
        held.open_s, held.rss_mb = loop.time() - started, read_rss()
        release.set()
        _, stuck = await asyncio.wait(tasks, timeout=10)
        for task in stuck:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        held.left_open = await _upstream_streams(session, stats_url, timeout_s=5)
    return held


async def _upstream_streams(session: aiohttp.ClientSession, url: str, timeout_s: float) -> int:
    """The streams a fake model server still serves, once none or after ``timeout_s``."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        async with session.get(url) as resp:
            left = int((await resp.json())["open_streams"])
        if left == 0 or asyncio.get_running_loop().time() > deadline:
            return left
        await asyncio.sleep(0.1)
