"""The upstream clients the framed hot-path prototypes (``hotpath_apps``) can use, behind one
shape: ``send`` returns a response whose head has arrived, read piece by piece.

* ``aiohttp``: one pooled ``ClientSession``, as gpugate's ``adapters/upstream_client.py``
  (string headers in, ``raw_headers`` out, a ``ClientTimeout`` per request);
* ``pyreqwest``: the Rust reqwest client behind a Python API, streamed responses (with its
  read-ahead buffer off: by default it holds the head back until 64 KiB of body or the end);
* ``raw``: ``hotpath_upstream``'s httptools connections, decoded mode.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any, Protocol

from hotpath import HOP_BY_HOP, NOT_FORWARDED, Upstream, upstream_head
from hotpath_upstream import DecodedConnection, Pool, Response, UpstreamFailed

TOTAL_S = 600.0
FIRST_BYTE_S = 60.0


class Reply(Protocol):
    status: int
    headers: list[tuple[bytes, bytes]]

    async def read_chunk(self) -> bytes: ...
    def at_eof(self) -> bool: ...
    async def aclose(self) -> None: ...


class Client(Protocol):
    async def start(self) -> None: ...
    async def send(
        self, up: Upstream, method: str, path: str, headers: list[tuple[bytes, bytes]], body: bytes
    ) -> Reply: ...


def _target(
    up: Upstream, path: str, headers: list[tuple[bytes, bytes]]
) -> tuple[str, list[tuple[str, str]]]:
    """The URL and the headers to forward, as strings (what the client libraries take)."""
    out = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in headers if k not in NOT_FORWARDED]
    return f"http://{up.host}:{up.port}{path}", out


# -- aiohttp ------------------------------------------------------------------------------------


class _AiohttpReply:
    __slots__ = ("_content", "_resp", "headers", "status")

    def __init__(self, resp: Any) -> None:
        self._resp = resp
        self._content = resp.content
        self.status = resp.status
        self.headers = [(k.lower(), v) for k, v in resp.raw_headers if k.lower() not in HOP_BY_HOP]

    async def read_chunk(self) -> bytes:
        import aiohttp

        try:
            return bytes(await self._content.readany())
        except aiohttp.ClientError as exc:
            raise UpstreamFailed(str(exc)) from exc

    def at_eof(self) -> bool:
        return bool(self._content.at_eof())

    async def aclose(self) -> None:
        if self._content.at_eof():
            self._resp.release()
        else:
            self._resp.close()


class AiohttpClient:
    def __init__(self) -> None:
        self._session: Any = None
        self._timeout: Any = None

    async def start(self) -> None:
        import aiohttp
        from bare_proxy import client_session

        self._session = client_session()
        self._timeout = aiohttp.ClientTimeout(total=TOTAL_S, sock_connect=5)

    async def send(
        self, up: Upstream, method: str, path: str, headers: list[tuple[bytes, bytes]], body: bytes
    ) -> Reply:
        import aiohttp

        url, out = _target(up, path, headers)
        try:
            resp = await self._session.request(
                method, url, headers=out, data=body, timeout=self._timeout, allow_redirects=False
            )
        except aiohttp.ClientError as exc:
            raise UpstreamFailed(str(exc)) from exc
        return _AiohttpReply(resp)


# -- pyreqwest ----------------------------------------------------------------------------------


class _PyreqwestReply:
    __slots__ = ("_eof", "_reader", "_request", "_resp", "headers", "status")

    def __init__(self, request: Any, resp: Any) -> None:
        self._request, self._resp = request, resp
        self.status = resp.status
        self.headers = [
            (k.encode("latin-1"), v.encode("latin-1"))
            for k, v in resp.headers.items()
            if k.encode("latin-1") not in HOP_BY_HOP
        ]
        self._reader = resp.body_reader  # a property
        self._eof = False

    async def read_chunk(self) -> bytes:
        chunk = await self._reader.read_chunk()
        if chunk is None:
            self._eof = True
            return b""
        return bytes(chunk)

    def at_eof(self) -> bool:
        return self._eof

    async def aclose(self) -> None:
        await self._request.__aexit__(None, None, None)


class PyreqwestClient:
    def __init__(self) -> None:
        self._client: Any = None

    async def start(self) -> None:
        from pyreqwest.client import ClientBuilder

        self._client = (
            ClientBuilder()
            .timeout(timedelta(seconds=TOTAL_S))
            .connect_timeout(timedelta(seconds=5))
            .pool_max_idle_per_host(4096)
            .http1_only()
            .build()
        )

    async def send(
        self, up: Upstream, method: str, path: str, headers: list[tuple[bytes, bytes]], body: bytes
    ) -> Reply:
        url, out = _target(up, path, headers)
        # By default the head is held back until 64 KiB of body have arrived, or the end: an SSE
        # stream's first event would wait for that.
        builder = self._client.request(method, url).headers(out).body_bytes(body)
        request = builder.streamed_read_buffer_limit(0).build_streamed()
        try:
            resp = await request.__aenter__()
        except Exception as exc:
            raise UpstreamFailed(str(exc)) from exc
        return _PyreqwestReply(request, resp)


# -- raw: httptools connections -----------------------------------------------------------------


class _RawReply:
    __slots__ = ("_response", "headers", "status")

    def __init__(self, response: Response) -> None:
        self._response = response
        self.status, self.headers = response.status, response.headers

    async def read_chunk(self) -> bytes:
        return await self._response.read_chunk()

    def at_eof(self) -> bool:
        return self._response.at_eof()

    async def aclose(self) -> None:
        self._response.release()


class RawClient:
    def __init__(self) -> None:
        self._pools: dict[str, Pool] = {}

    async def start(self) -> None:
        pass

    async def send(
        self, up: Upstream, method: str, path: str, headers: list[tuple[bytes, bytes]], body: bytes
    ) -> Reply:
        pool = self._pools.get(up.id)
        if pool is None:
            pool = self._pools[up.id] = Pool(up.host, up.port, DecodedConnection)
        head = upstream_head(method.encode(), path.encode(), headers, up, len(body))
        response = Response()
        await response.start(pool, head, body, FIRST_BYTE_S)
        return _RawReply(response)


CLIENTS: dict[str, Callable[[], Client]] = {
    "aiohttp": AiohttpClient,
    "pyreqwest": PyreqwestClient,
    "raw": RawClient,
}
