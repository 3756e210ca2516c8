"""The data plane's upstream client against the aiohttp one it replaced, in the same run.

Both are gpugate's own ``adapters/upstream_client.py``: today's (``adapters/http1``: asyncio
protocols + httptools) and the last one built on aiohttp (read from git at ``AIOHTTP_COMMIT``
and imported under another name), so what is measured is each client with gpugate's own layer
on it: header filtering, timeouts, error translation. The same loop for both: ``send`` the
proxy's headers and a chat body, ``read`` the answer, ``release``.

A fake upstream (uvloop, an ``asyncio.Protocol`` answering from memory) runs in a child process
pinned to CPU 0; this process, the client, is pinned to CPU 1 (with one CPU, both share it).
Each phase alternates the two clients (old, new, old, new, ...) so a machine that gets busier
halfway hurts both alike; the CPU time is this process's (``time.process_time``): the client
and its event loop, not the server.

    python bench/upstream_client.py [--duration 3] [--rounds 3]

Phases: non-streaming chat at 64 concurrent requests (the hot path under load), one at a time
(latency: µs per round trip, server included), SSE of 23 events at 16 concurrent, and 256 slow
streams (23 events 50 ms apart: the time to the first event, p50 and p99, as ``bench/proxy.py``'s
slow-streams phase asks of the whole gateway).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
#: The last commit whose ``adapters/upstream_client.py`` was built on aiohttp.
AIOHTTP_COMMIT = "6fb9835"

CHAT = (
    b'{"id":"c1","object":"chat.completion","model":"m","choices":[{"index":0,"message":'
    b'{"role":"assistant","content":"cedar meadow quartz inlet nectar breeze"},'
    b'"finish_reason":"stop"}],"usage":{"prompt_tokens":9,"completion_tokens":6,"total_tokens":15}}'
)
EVENT = b'data: {"choices":[{"index":0,"delta":{"content":"cedar "}}]}\n\n'
BODY = b'{"model":"m","messages":[{"role":"user","content":"hello there"}],"max_tokens":16}'
HEADERS = [
    (b"content-type", b"application/json"),
    (b"accept", b"application/json"),
    (b"user-agent", b"OpenAI/Python 1.54.0"),
    (b"authorization", b"Bearer sk-upstream"),
    (b"x-request-id", b"4f7dd9d7bacc00000001"),
    (b"traceparent", b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
    (b"x-stainless-lang", b"python"),
    (b"x-stainless-retry-count", b"0"),
]


# -- the fake upstream (child process) ---------------------------------------------------------


def _serve(port_out: Any, cpu: int | None) -> None:
    import httptools
    import uvloop

    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    chat = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (
        len(CHAT),
        CHAT,
    )
    piece = b"%x\r\n%s\r\n" % (len(EVENT), EVENT)
    done = b"data: [DONE]\n\n"
    sse = (
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
        + piece * 23
        + b"%x\r\n%s\r\n0\r\n\r\n" % (len(done), done)
    )

    class Upstream(asyncio.Protocol):
        def __init__(self) -> None:
            self.parser = httptools.HttpRequestParser(self)
            self.url = b""

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport = transport

        def data_received(self, data: bytes) -> None:
            self.parser.feed_data(data)

        def on_url(self, url: bytes) -> None:
            self.url = url

        def on_message_complete(self) -> None:
            write = self.transport.write  # type: ignore[attr-defined]
            if self.url.startswith(b"/slow"):  # the first event now, then one per 50 ms
                write(sse[: sse.index(piece) + len(piece)])
                loop = asyncio.get_running_loop()
                for i in range(1, 23):
                    loop.call_later(0.05 * i, write, piece)
                loop.call_later(0.05 * 23, write, b"0\r\n\r\n")
            else:
                write(sse if self.url.startswith(b"/stream") else chat)

    async def main() -> None:
        server = await asyncio.get_running_loop().create_server(Upstream, "127.0.0.1", 0)
        port_out.send(server.sockets[0].getsockname()[1])
        await asyncio.Event().wait()

    uvloop.run(main())


# -- the two clients ----------------------------------------------------------------------------


def aiohttp_client_module() -> ModuleType:
    """gpugate's ``upstream_client`` as it was on aiohttp, imported as ``old_upstream_client``."""
    source = subprocess.run(
        [
            "git",
            "-C",
            str(ROOT),
            "show",
            f"{AIOHTTP_COMMIT}:src/gpugate/adapters/upstream_client.py",
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    path = Path(tempfile.mkdtemp()) / "old_upstream_client.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("old_upstream_client", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["old_upstream_client"] = module
    spec.loader.exec_module(module)
    return module


async def one_request(client: Any, timeouts: Any, url: str, ttfb: list[float] | None = None) -> int:
    loop = asyncio.get_running_loop()
    sent = loop.time()
    response = await client.send("POST", url, HEADERS, BODY, timeouts)
    try:
        if ttfb is not None:  # the time to the first piece of the body
            await response.read_chunk()
            ttfb.append(loop.time() - sent)
        await response.read()
    finally:
        response.release()
    return 1


async def phase(
    make: Callable[[], Any],
    timeouts: Any,
    url: str,
    concurrency: int,
    seconds: float,
    ttfb: list[float] | None = None,
) -> tuple[float, float]:
    """(requests per second, CPU µs of this process per request) for ``seconds``; each time to
    the first piece of the body added to ``ttfb`` when given."""
    client = make()
    await client.start()
    try:
        for _ in range(200 if ttfb is None else 0):  # warm: connections open, caches filled
            await one_request(client, timeouts, url)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        count = 0

        async def worker() -> None:
            nonlocal count
            while loop.time() < deadline:
                done = await one_request(client, timeouts, url, ttfb)
                count += done  # after the await: ``count += await ...`` would read it before

        cpu, wall = time.process_time(), time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    finally:
        await client.close()
    return count / wall, cpu / count * 1e6


async def run(args: argparse.Namespace, port: int) -> int:
    from gpugate.adapters import upstream_client as new

    old = aiohttp_client_module()
    clients = {
        "aiohttp (before)": (old.UpstreamClient, old.Timeouts(5.0, 60.0, 300.0)),
        "http1 (now)": (new.UpstreamClient, new.Timeouts(5.0, 60.0, 300.0)),
    }
    base = f"http://127.0.0.1:{port}"
    phases = [
        ("chat, 64 concurrent", base + "/v1/chat/completions", 64),
        ("chat, one at a time", base + "/v1/chat/completions", 1),
        ("SSE 23 events, 16 concurrent", base + "/stream/v1/chat/completions", 16),
    ]
    slow = ("slow SSE: 256 streams, 23 events 50 ms apart", base + "/slow/v1/chat/completions")
    print(
        f"{args.duration:g} s per run, {args.rounds} rounds alternated;"
        f" client on CPU {args.client_cpu}, upstream on CPU {args.server_cpu}"
    )
    print(f"load average at start: {' '.join(f'{x:.1f}' for x in os.getloadavg())}\n")
    print("| phase | client | req/s per round | CPU µs/req per round | CPU x aiohttp (median) |")
    print("|---|---|---|---|---|")
    for name, url, concurrency in phases:
        results: dict[str, list[tuple[float, float]]] = {label: [] for label in clients}
        for _ in range(args.rounds):
            for label, (make, timeouts) in clients.items():
                results[label].append(await phase(make, timeouts, url, concurrency, args.duration))
        before = results["aiohttp (before)"]
        for label, rows in results.items():
            ratios = [r[1] / b[1] for r, b in zip(rows, before, strict=True)]
            rps = " / ".join(f"{r[0]:,.0f}" for r in rows)
            cpu = " / ".join(f"{r[1]:.0f}" for r in rows)
            print(f"| {name} | {label} | {rps} | {cpu} | {statistics.median(ratios):.2f} |")
    print(f"\n| {slow[0]} | client | TTFB p50 / p99 ms per round | CPU µs/stream per round |")
    print("|---|---|---|---|")
    cells: dict[str, list[str]] = {label: [] for label in clients}
    cpus: dict[str, list[str]] = {label: [] for label in clients}
    for _ in range(args.rounds):
        for label, (make, timeouts) in clients.items():
            ttfb: list[float] = []
            _, cpu = await phase(make, timeouts, slow[1], 256, max(args.duration, 2.0), ttfb)
            ttfb.sort()
            p50, p99 = ttfb[len(ttfb) // 2] * 1e3, ttfb[int(len(ttfb) * 0.99)] * 1e3
            cells[label].append(f"{p50:.1f} / {p99:.1f}")
            cpus[label].append(f"{cpu:.0f}")
    for label in clients:
        print(f"| | {label} | {' · '.join(cells[label])} | {' / '.join(cpus[label])} |")
    print(f"\nload average at end: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=3.0, help="seconds per measured run (3)")
    parser.add_argument("--rounds", type=int, default=3, help="alternations of the two clients (3)")
    args = parser.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    args.server_cpu = cpus[0]
    args.client_cpu = cpus[1] if len(cpus) > 1 else cpus[0]
    ours, theirs = multiprocessing.Pipe()
    server = multiprocessing.get_context("spawn").Process(
        target=_serve, args=(theirs, args.server_cpu), daemon=True
    )
    server.start()
    try:
        if not ours.poll(30):
            print("the fake upstream did not start", file=sys.stderr)
            return 1
        port = ours.recv()
        os.sched_setaffinity(0, {args.client_cpu})
        import uvloop

        return uvloop.run(run(args, port))
    finally:
        server.kill()
        with contextlib.suppress(Exception):
            server.join(5)


if __name__ == "__main__":
    sys.exit(main())
