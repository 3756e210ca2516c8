"""The only sender of model traffic: one pooled aiohttp session, errors translated where they enter.

Why aiohttp and not httpx: docs/decisions.md §1 (12x less CPU per request at 64 connections).
Headers travel as raw ``(bytes, bytes)`` pairs and bodies as raw chunks: nothing is parsed or
re-serialised on the way through.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

import aiohttp

from gpugate.errors import GatewayOverloaded, UpstreamError, UpstreamTimeout, UpstreamUnreachable

log = logging.getLogger("gpugate.upstream")
#: The gateway's own limits, not the upstream's fault (#14.5): out of file descriptors.
_OWN_LIMITS = frozenset({errno.EMFILE, errno.ENFILE})

# RFC 9110 §7.6.1 connection-specific fields, plus what the client library sets itself.
HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
    }
)
_NOT_FORWARDED = HOP_BY_HOP | {b"host", b"content-length"}


def connection_named(headers: Iterable[tuple[bytes, bytes]]) -> frozenset[bytes]:
    """The fields a ``Connection`` header names: hop-by-hop too (RFC 9110 §7.6.1), so never
    forwarded, either way (issue #15 finding 8)."""
    named = [
        token.strip().lower()
        for name, value in headers
        if name.lower() == b"connection"
        for token in value.split(b",")
    ]
    return frozenset(token for token in named if token)


def _reason(exc: Exception, url: str) -> str:
    """What went wrong, without the URL's host (an aiohttp message may carry it)."""
    text = str(exc) or type(exc).__name__
    parts = urlsplit(url)
    names = [n for n in (parts.netloc, parts.hostname) if n]
    return type(exc).__name__ if any(n in text for n in names) else text


def _os_reason(error: OSError, url: str) -> str:
    """A connect failure's reason (``Connection refused``), without the address."""
    if error.errno:  # "Connection refused": the system's words, never the address
        return os.strerror(error.errno)
    return _reason(error, url)


@dataclass(frozen=True, slots=True)
class Timeouts:
    """Per-request limits, in seconds."""

    connect_s: float
    first_byte_s: float
    total_s: float


class UpstreamResponse:
    """An upstream's response whose headers have arrived; the body is read as it comes."""

    __slots__ = ("_content", "_resp", "headers", "status")

    def __init__(self, resp: aiohttp.ClientResponse) -> None:
        self._resp = resp
        self._content = resp.content
        self.status = resp.status
        dropped = HOP_BY_HOP | connection_named(resp.raw_headers)
        self.headers: list[tuple[bytes, bytes]] = [
            (k.lower(), v) for k, v in resp.raw_headers if k.lower() not in dropped
        ]

    async def read_chunk(self) -> bytes:
        """The next piece of the body as soon as it arrives, ``b""`` at the end; a failure
        mid-body raises :class:`UpstreamError`."""
        try:
            return await self._content.readany()
        except (TimeoutError, aiohttp.ServerTimeoutError) as exc:
            raise UpstreamTimeout("the upstream stopped sending before the end") from exc
        except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError) as exc:
            raise UpstreamError(f"the upstream broke off the response: {exc}") from exc

    def at_eof(self) -> bool:
        """Whether the whole body has been read."""
        return self._content.at_eof()

    def set_idle_timeout(self, seconds: float | None) -> None:
        """From now on, a silence longer than ``seconds`` between two pieces of the body fails
        the next :meth:`read_chunk` with :class:`UpstreamTimeout` (aiohttp's socket read timer,
        re-armed by each packet: no timer of our own per chunk)."""
        connection = self._resp.connection
        protocol = connection.protocol if connection is not None else None
        if protocol is not None:
            protocol.read_timeout = seconds
            protocol.start_timeout()

    async def read(self) -> bytes:
        """The whole body (for small, non-streaming responses)."""
        parts = []
        while chunk := await self.read_chunk():
            parts.append(chunk)
        return b"".join(parts)

    def release(self) -> None:
        """Done with the body: the connection returns to the pool if it was read to the end,
        and is closed otherwise (so an abandoned generation stops on the upstream)."""
        if self._content.at_eof():
            self._resp.release()
        else:
            self._resp.close()


class UpstreamClient:
    """A pooled keep-alive HTTP client for model servers."""

    def __init__(self, *, limit: int = 0, keepalive_s: float = 30.0) -> None:
        self._limit = limit
        self._keepalive_s = keepalive_s
        self._session: aiohttp.ClientSession | None = None
        self._timeouts: dict[Timeouts, aiohttp.ClientTimeout] = {}

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(
            limit=self._limit, keepalive_timeout=self._keepalive_s, ttl_dns_cache=300
        )
        self._session = aiohttp.ClientSession(
            connector=connector,
            auto_decompress=False,
            skip_auto_headers=("User-Agent", "Accept-Encoding", "Content-Type"),
            timeout=aiohttp.ClientTimeout(total=None),
        )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def send(
        self,
        method: str,
        url: str,
        headers: Iterable[tuple[bytes, bytes]],
        body: bytes | AsyncIterator[bytes] | None,
        timeouts: Timeouts,
        *,
        label: str | None = None,
    ) -> UpstreamResponse:
        """Send a request and wait for the response headers (bounded by ``first_byte_s``).

        Errors name the target as ``label`` when given (what a client may read: an upstream's
        id, not its URL), else as the URL."""
        where = label or url
        assert self._session is not None, "UpstreamClient.start() was not awaited"
        headers = list(headers)
        dropped = _NOT_FORWARDED | connection_named(headers)
        out = [
            (name.decode("latin-1"), value.decode("latin-1"))
            for name, value in headers
            if name.lower() not in dropped
        ]
        timeout = self._timeouts.get(timeouts)
        if timeout is None:
            timeout = aiohttp.ClientTimeout(total=timeouts.total_s, sock_connect=timeouts.connect_s)
            self._timeouts[timeouts] = timeout
        request = self._session.request(
            method, url, headers=out, data=body, timeout=timeout, allow_redirects=False
        )
        try:
            if timeouts.first_byte_s < timeouts.total_s:
                async with asyncio.timeout(timeouts.first_byte_s):
                    resp = await request
            else:  # the total timeout bounds the first byte too: spare the extra timer
                resp = await request
        except aiohttp.ConnectionTimeoutError as exc:
            raise UpstreamTimeout(f"connect to {where} timed out", connect_failed=True) from exc
        except aiohttp.ClientConnectorError as exc:
            if exc.os_error.errno in _OWN_LIMITS:
                log.error(  # noqa: TRY400 - our own limit, not a bug: no traceback
                    "cannot connect to %s: the gateway is out of file descriptors", url
                )
                raise GatewayOverloaded(
                    "the gateway is out of file descriptors; retry shortly", retry_after_s=1.0
                ) from exc
            raise UpstreamUnreachable(
                f"cannot connect to {where}: {_os_reason(exc.os_error, url)}",
                connect_failed=True,
            ) from exc
        except (TimeoutError, aiohttp.ServerTimeoutError) as exc:
            raise UpstreamTimeout(f"{where} sent no response within the timeout") from exc
        except aiohttp.ClientError as exc:
            raise UpstreamUnreachable(
                f"{where} failed before responding: {_reason(exc, url)}"
            ) from exc
        return UpstreamResponse(resp)

    async def get(self, url: str, timeout_s: float) -> tuple[int, bytes]:
        """``GET url`` and its whole (small) body, within ``timeout_s`` all told: for probes
        and scrapes."""
        response = await self.send("GET", url, [], None, Timeouts(timeout_s, timeout_s, timeout_s))
        try:
            return response.status, await response.read()
        finally:
            response.release()

    def __repr__(self) -> str:
        state = "open" if self._session is not None else "closed"
        return f"<UpstreamClient {state}>"
