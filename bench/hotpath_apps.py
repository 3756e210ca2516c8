"""The framed hot-path prototypes: ``hotpath.HotPath`` behind a server that frames responses
itself, with one of ``hotpath_clients``' upstream clients.

* ``asgi_app``: raw ASGI (no framework) on uvicorn with uvloop and httptools — the stack
  gpugate's data plane runs on today, with only the hot path on it;
* ``rsgi_app``: granian's RSGI interface (the Rust server hands Python the whole body and
  takes the response as bytes or a stream), on uvloop.

Both do what gpugate does per request: read the body, decide (``HotPath.admit``), send the
original bytes upstream, relay the answer piece by piece as it arrives (a body complete in its
first piece goes out in one message), and watch for the client going away meanwhile (a watcher
task per request, as gpugate's ``DataPlane._forward``), which cancels the relay.

    python bench/hotpath_apps.py --server uvicorn|granian --client aiohttp|raw|pyreqwest \\
        --port 8200 --route json-model=127.0.0.1:9001 ... [--parse ...] [--metrics ...]

For granian the arguments travel to its worker in ``HOTPATH_ARGS`` (JSON).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from hotpath import HotPath, Refused, arguments, routes_of
from hotpath_clients import CLIENTS, Client, Reply
from hotpath_upstream import UpstreamFailed

ROUTES = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/embeddings"})
_JSON_CT = "application/json"


class Shared:
    """The hot path and the client of one worker process."""

    def __init__(self, args: dict[str, Any]) -> None:
        self.args = args
        self.hot: HotPath | None = None
        self.client: Client | None = None

    async def ready(self) -> tuple[HotPath, Client]:
        if self.hot is None or self.client is None:
            routes = {m: (h, int(p)) for m, (h, p) in self.args["routes"].items()}
            client = CLIENTS[self.args["client"]]()
            await client.start()
            self.hot = HotPath(routes, self.args["parse"], self.args["metrics"])
            self.client = client
        return self.hot, self.client


async def _watched(work: Awaitable[None], disconnected: Callable[[], Awaitable[Any]]) -> None:
    """Run ``work``; cancel it if the client goes away first."""
    task = asyncio.current_task()
    assert task is not None
    watcher = asyncio.ensure_future(disconnected())

    def gone(done: asyncio.Future[Any]) -> None:
        if not done.cancelled() and done.exception() is None:
            task.cancel()

    watcher.add_done_callback(gone)
    try:
        await work
    except asyncio.CancelledError:
        if not (watcher.done() and not watcher.cancelled()):
            raise
        task.uncancel()
    finally:
        watcher.remove_done_callback(gone)
        watcher.cancel()


# -- ASGI on uvicorn ----------------------------------------------------------------------------


class AsgiApp:
    def __init__(self, shared: Shared) -> None:
        self.shared = shared

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await self.shared.ready()
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        if scope["type"] != "http":
            return
        hot, client = await self.shared.ready()
        path = scope["path"]
        if path not in ROUTES:
            await self._local(hot, path, send)
            return
        started = time.perf_counter()
        parts, more = [], True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            parts.append(message.get("body", b""))
            more = message.get("more_body", False)
        body = parts[0] if len(parts) == 1 else b"".join(parts)
        try:
            p, _stream = hot.admit(body, started)
        except Refused as refused:
            await _asgi_answer(send, refused.status, refused.body())
            return

        async def disconnected() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass

        await _watched(self._relay(hot, client, p, scope, body, send), disconnected)

    async def _relay(
        self, hot: HotPath, client: Client, p: Any, scope: dict[str, Any], body: bytes, send: Any
    ) -> None:
        sent_at = time.perf_counter()
        try:
            reply = await client.send(p.upstream, "POST", scope["path"], scope["headers"], body)
        except UpstreamFailed as exc:
            hot.abandon(p)
            await _asgi_answer(send, 502, Refused(502, "UPSTREAM_ERROR", str(exc)).body())
            return
        ttfb = time.perf_counter() - sent_at
        done = False
        try:
            headers = [*reply.headers, (b"x-gateway-upstream", p.upstream.id.encode())]
            await send({"type": "http.response.start", "status": reply.status, "headers": headers})
            while chunk := await reply.read_chunk():
                last = reply.at_eof()
                await send({"type": "http.response.body", "body": chunk, "more_body": not last})
                if last:
                    break
            else:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
            done = True
        finally:
            await _settle(hot, p, reply, ttfb, done=done)

    async def _local(self, hot: HotPath, path: str, send: Any) -> None:
        if path == "/metrics":
            await _asgi_answer(send, 200, hot.metrics.render(), b"text/plain; version=0.0.4")
        elif path in ("/health", "/readyz"):
            await _asgi_answer(send, 200, b"ok", b"text/plain")
        else:
            await _asgi_answer(send, 404, b'{"error":"not found"}')


async def _settle(hot: HotPath, p: Any, reply: Reply, ttfb: float, *, done: bool) -> None:
    """Close the reply; record the request as finished, or abandoned half way."""
    await reply.aclose()
    if done:
        hot.finish(p, reply.status, ttfb)
    else:
        hot.abandon(p)


async def _asgi_answer(
    send: Any, status: int, body: bytes, ct: bytes = b"application/json"
) -> None:
    headers = [(b"content-type", ct), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


# -- RSGI on granian ----------------------------------------------------------------------------


class RsgiApp:
    def __init__(self, shared: Shared) -> None:
        self.shared = shared

    async def __rsgi__(self, scope: Any, proto: Any) -> None:
        hot, client = await self.shared.ready()
        path = scope.path
        if path not in ROUTES:
            if path == "/metrics":
                proto.response_bytes(200, [("content-type", "text/plain")], hot.metrics.render())
            elif path in ("/health", "/readyz"):
                proto.response_bytes(200, [("content-type", "text/plain")], b"ok")
            else:
                proto.response_bytes(404, [("content-type", _JSON_CT)], b'{"error":"not found"}')
            return
        started = time.perf_counter()
        body = await proto()
        try:
            p, _stream = hot.admit(body, started)
        except Refused as refused:
            proto.response_bytes(refused.status, [("content-type", _JSON_CT)], refused.body())
            return
        headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in scope.headers.items()]
        await _watched(
            self._relay(hot, client, p, headers, path, body, proto), proto.client_disconnect
        )

    async def _relay(
        self,
        hot: HotPath,
        client: Client,
        p: Any,
        headers: list[tuple[bytes, bytes]],
        path: str,
        body: bytes,
        proto: Any,
    ) -> None:
        sent_at = time.perf_counter()
        try:
            reply = await client.send(p.upstream, "POST", path, headers, body)
        except UpstreamFailed as exc:
            hot.abandon(p)
            failed = Refused(502, "UPSTREAM_ERROR", str(exc)).body()
            proto.response_bytes(502, [("content-type", _JSON_CT)], failed)
            return
        ttfb = time.perf_counter() - sent_at
        done = False
        try:
            out = [
                (k.decode("latin-1"), v.decode("latin-1"))
                for k, v in reply.headers
                if k != b"content-length"  # granian frames the answer itself
            ]
            out.append(("x-gateway-upstream", p.upstream.id))
            chunk = await reply.read_chunk()
            if reply.at_eof():
                proto.response_bytes(reply.status, out, chunk)
            else:
                stream = proto.response_stream(reply.status, out)
                while chunk:
                    await stream.send_bytes(chunk)
                    chunk = await reply.read_chunk()
            done = True
        finally:
            await _settle(hot, p, reply, ttfb, done=done)


def _from_env() -> Shared:
    return Shared(json.loads(os.environ.get("HOTPATH_ARGS", "{}")))


rsgi_app = RsgiApp(_from_env())


def main() -> int:
    parser = arguments(__doc__.splitlines()[0])
    parser.add_argument("--server", choices=("uvicorn", "granian"), required=True)
    parser.add_argument("--client", choices=sorted(CLIENTS), required=True)
    args = parser.parse_args()
    shared_args = {
        "routes": routes_of(args),
        "client": args.client,
        "parse": args.parse,
        "metrics": args.metrics,
    }
    if args.server == "uvicorn":
        import uvicorn
        from bare_proxy import uvicorn_config  # the bare proxy's settings, the same server

        config = uvicorn_config(AsgiApp(Shared(shared_args)), host="127.0.0.1", port=args.port)
        uvicorn.Server(config).run()
        return 0
    granian = str(Path(sys.executable).parent / "granian")  # beside this venv's python
    argv = [granian, "--interface", "rsgi", "--host", "127.0.0.1", "--port", str(args.port)]
    argv += ["--workers", "1", "--runtime-threads", "1", "--loop", "uvloop", "--http", "1"]
    argv += ["--no-ws", "--backlog", "4096", "--backpressure", "8192", "--log-level", "warning"]
    env = {**os.environ, "HOTPATH_ARGS": json.dumps(shared_args)}
    with contextlib.suppress(KeyboardInterrupt):
        os.execve(granian, [*argv, "hotpath_apps:rsgi_app"], env)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
