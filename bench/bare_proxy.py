"""The baseline of the proxy benchmark: a bare uvicorn + aiohttp reverse proxy, nothing else.

Raw ASGI on uvicorn (uvloop, httptools, one worker) with one pooled ``aiohttp.ClientSession``:
the request body is read whole and forwarded, the response is relayed chunk by chunk. The only
routing is a fixed upstream per listening port, so what gpugate spends beyond this is the price
of its own request path (routing, admission, health, metrics, and watching for clients that
go away: this proxy relays an abandoned stream to its end).

    python bench/bare_proxy.py --route 8101=http://127.0.0.1:9001 --route 8102=http://...
"""

from __future__ import annotations

import argparse
import socket
from typing import Any

import aiohttp
import uvicorn

Scope = dict[str, Any]
Receive = Any
Send = Any

HOP_BY_HOP = frozenset(
    {b"connection", b"keep-alive", b"transfer-encoding", b"te", b"trailer", b"upgrade"}
)
_NOT_FORWARDED = HOP_BY_HOP | {b"host", b"content-length"}


class BareProxy:
    """An ASGI app forwarding each request to the upstream of the port it arrived on."""

    def __init__(self, routes: dict[int, str]) -> None:
        self.routes = routes
        self.session: aiohttp.ClientSession | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif scope["type"] == "http":
            await self._forward(scope, receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self.session = client_session()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self.session is not None:
                    await self.session.close()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _forward(self, scope: Scope, receive: Receive, send: Send) -> None:
        assert self.session is not None
        body = b""
        more = True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        query = scope["query_string"]
        url = (
            self.routes[scope["server"][1]]
            + scope["path"]
            + ("?" + query.decode() if query else "")
        )
        headers = [
            (k.decode("latin-1"), v.decode("latin-1"))
            for k, v in scope["headers"]
            if k not in _NOT_FORWARDED
        ]
        async with self.session.request(scope["method"], url, headers=headers, data=body) as resp:
            out = [(k.lower(), v) for k, v in resp.raw_headers if k.lower() not in HOP_BY_HOP]
            await send({"type": "http.response.start", "status": resp.status, "headers": out})
            async for chunk in resp.content.iter_any():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})


def client_session() -> aiohttp.ClientSession:
    """One pooled session, set up as gpugate's upstream client sets up its own."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=30),
        auto_decompress=False,
        skip_auto_headers=("User-Agent", "Accept-Encoding", "Content-Type"),
        timeout=aiohttp.ClientTimeout(total=None),
    )


def uvicorn_config(app: Any, **more: Any) -> uvicorn.Config:
    """uvicorn as gpugate runs it: uvloop, httptools, no access log, no extra headers."""
    settings: dict[str, Any] = {
        "loop": "uvloop",
        "http": "httptools",
        "lifespan": "on",
        "access_log": False,
        "log_level": "warning",
        "server_header": False,
        "date_header": False,
        "backlog": 4096,
    }
    return uvicorn.Config(app, **{**settings, **more})


def _listen(port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(2048)
    return sock


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--route", action="append", required=True, help="PORT=UPSTREAM_URL")
    args = parser.parse_args()
    routes = {int(port): url.rstrip("/") for port, _, url in (r.partition("=") for r in args.route)}
    uvicorn.Server(uvicorn_config(BareProxy(routes))).run(
        sockets=[_listen(port) for port in routes]
    )


if __name__ == "__main__":
    main()
