"""The only sender of model traffic: gpugate's own pooled HTTP/1.1 client, errors translated
where they enter.

The connections, the parsing and the pools are :mod:`gpugate.adapters.http1` (asyncio protocols
and ``httptools``); this module is the data plane's interface to them: one request in, a
:class:`UpstreamResponse` out, failures as :class:`UpstreamUnreachable` / :class:`UpstreamTimeout`
/ :class:`UpstreamError` naming the target by its label, never its address. Why not aiohttp any
more (it was, docs/decisions.md §1): §11, phase 2 — its client was ~45 % of the gateway's CPU per
proxied request. Headers travel as raw ``(bytes, bytes)`` pairs and bodies as raw chunks: nothing
is parsed or re-serialised on the way through. Like aiohttp's default session: no proxy from the
environment, TLS verified against the system's CAs with hostname checks, ``user:password@`` in a
URL sent as Basic credentials.
"""

from __future__ import annotations

import base64
import errno
import logging
import os
import socket
import ssl
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass
from urllib.parse import quote, unquote, urlsplit

from gpugate.adapters import http1, http1_pool
from gpugate.adapters.http1 import HOP_BY_HOP
from gpugate.adapters.http1_pool import Timeouts
from gpugate.errors import GatewayOverloaded, UpstreamTimeout, UpstreamUnreachable

__all__ = [
    "HOP_BY_HOP",
    "Timeouts",
    "UpstreamClient",
    "UpstreamResponse",
    "connection_named",
]

log = logging.getLogger("gpugate.upstream")
#: The gateway's own limits, not the upstream's fault (#14.5): out of file descriptors.
_OWN_LIMITS = frozenset({errno.EMFILE, errno.ENFILE})
_NOT_FORWARDED = HOP_BY_HOP | {b"host", b"content-length"}
#: Methods sent without ``Content-Length: 0`` when they carry no body (as aiohttp did).
_BODYLESS = frozenset({"GET", "HEAD", "OPTIONS", "CONNECT", "TRACE"})
#: A request target's characters kept as they are: every printable ASCII but the space.
_TARGET_SAFE = "".join(chr(c) for c in range(0x21, 0x7F) if not chr(c).isalnum())
#: Origins kept apart in the pool map beyond which pools with no connection are dropped.
_POOLS_KEPT = 64


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


def _reason(exc: BaseException, url: str) -> str:
    """What went wrong, without the URL's host (a message may carry it)."""
    text = str(exc) or type(exc).__name__
    parts = urlsplit(url)
    names = [n for n in (parts.netloc, parts.hostname) if n]
    return type(exc).__name__ if any(n in text for n in names) else text


def _os_reason(error: OSError, url: str) -> str:
    """A connect failure's reason (``Connection refused``), without the address."""
    if isinstance(error, ssl.SSLCertVerificationError):
        return "TLS certificate verification failed: " + _reason(
            ValueError(error.verify_message or "rejected"), url
        )
    if isinstance(error, ssl.SSLError):
        return f"TLS handshake failed: {error.reason or type(error).__name__}"
    if isinstance(error, socket.gaierror):
        return error.strerror or "the name does not resolve"
    if error.errno:  # "Connection refused": the system's words, never the address
        return os.strerror(error.errno)
    return _reason(error, url)


class UpstreamResponse(http1.Response):
    """An upstream's response whose headers have arrived; the body is read as it comes
    (:meth:`read_chunk`, :meth:`at_eof`, :meth:`set_idle_timeout`, :meth:`read`,
    :meth:`release`: :class:`gpugate.adapters.http1.Response`)."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class _Origin:
    """What an origin's requests share: its pool and its part of every head."""

    pool: http1_pool.Pool
    host: bytes  # the Host header's value: host[:port], the port only when not the default
    authorization: bytes | None  # from ``user:password@`` in the URL


class UpstreamClient:
    """A pooled keep-alive HTTP client for model servers."""

    def __init__(self, *, limit: int = 0, keepalive_s: float = 30.0, max_idle: int = 256) -> None:
        self._limit = http1_pool.Limit(limit)
        self._keepalive_s = keepalive_s
        self._max_idle = max_idle
        self._origins: dict[str, _Origin] | None = None
        self._tls: ssl.SSLContext | None = None

    async def start(self) -> None:
        self._origins = {}

    async def close(self) -> None:
        if self._origins is not None:
            for origin in self._origins.values():
                origin.pool.close()
            self._origins = None

    def _origin(self, origin_url: str) -> _Origin:
        assert self._origins is not None, "UpstreamClient.start() was not awaited"
        parts = urlsplit(origin_url)
        host = parts.hostname or ""
        tls = parts.scheme == "https"
        port = parts.port or (443 if tls else 80)
        if tls and self._tls is None:
            self._tls = http1.default_ssl_context()  # once; reads the CA files
        shown = f"[{host}]" if ":" in host else host
        if port != (443 if tls else 80):
            shown += f":{port}"
        authorization = None
        if parts.username is not None:
            pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
            authorization = b"Basic " + base64.b64encode(pair.encode())
        if len(self._origins) >= _POOLS_KEPT:  # config reloads: drop the pools nobody uses
            for url in [u for u, o in self._origins.items() if o.pool.empty()]:
                del self._origins[url]
        pool = http1_pool.Pool(
            host,
            port,
            ssl_context=self._tls if tls else None,
            limit=self._limit,
            keepalive_s=self._keepalive_s,
            max_idle=self._max_idle,
        )
        named = shown.encode("ascii") if shown.isascii() else shown.encode("idna")
        made = self._origins[origin_url] = _Origin(pool, named, authorization)
        return made

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
        assert self._origins is not None, "UpstreamClient.start() was not awaited"
        cut = url.find("/", url.find("://") + 3)
        query = url.find("?", url.find("://") + 3)
        if cut < 0 or 0 <= query < cut:
            cut = query
        origin_url, target = (url, "/") if cut < 0 else (url[:cut], url[cut:])
        if target[0] == "?":
            target = "/" + target
        origin = self._origins.get(origin_url)
        if origin is None:
            try:
                origin = self._origin(origin_url)
            except ValueError as exc:  # a port out of range, a host IDNA cannot encode
                raise UpstreamUnreachable(
                    f"cannot connect to {where}: the URL is invalid", connect_failed=True
                ) from exc
        head = _head(
            method, target, origin, headers if isinstance(headers, list) else list(headers), body
        )
        response = UpstreamResponse(origin.pool.loop)
        try:
            await http1_pool.exchange(
                origin.pool, response, head, body, timeouts, head_only=method == "HEAD"
            )
        except http1.ConnectTimedOut as exc:
            raise UpstreamTimeout(f"connect to {where} timed out", connect_failed=True) from exc
        except http1.ConnectFailed as exc:
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
        except http1.HeadTimedOut as exc:
            raise UpstreamTimeout(f"{where} sent no response within the timeout") from exc
        except http1.HeadFailed as exc:
            raise UpstreamUnreachable(
                f"{where} failed before responding: {_reason(exc, url)}"
            ) from exc
        return response

    async def get(self, url: str, timeout_s: float) -> tuple[int, bytes]:
        """``GET url`` and its whole (small) body, within ``timeout_s`` all told: for probes
        and scrapes."""
        response = await self.send("GET", url, [], None, Timeouts(timeout_s, timeout_s, timeout_s))
        try:
            return response.status, await response.read()
        finally:
            response.release()

    def __repr__(self) -> str:
        if self._origins is None:
            return "<UpstreamClient closed>"
        pools = " ".join(repr(o.pool) for o in self._origins.values())
        return f"<UpstreamClient open in_use={self._limit.in_use} {pools}>".replace(" >", ">")


def _head(
    method: str,
    target: str,
    origin: _Origin,
    headers: Sequence[tuple[bytes, bytes]],
    body: bytes | AsyncIterator[bytes] | None,
    named: frozenset[bytes] = frozenset(),
) -> bytes:
    """The request's head: the request line, ``Host``, the forwarded headers (hop-by-hop, any a
    ``Connection`` header names, and the client's ``Host``/``Content-Length`` dropped), the
    body's framing. A line break inside a name or a value is refused (``ValueError``, as aiohttp
    did): it would split the head."""
    if not (target.isascii() and target.isprintable()) or " " in target:
        target = quote(target, safe=_TARGET_SAFE)  # as aiohttp's URL did: never a raw space
    parts = [
        method.encode("ascii"),
        b" ",
        target.encode("ascii"),
        b" HTTP/1.1\r\nhost: ",
        origin.host,
    ]
    lines = 3  # after the request line, and the blank line after the last header
    for name, value in headers:
        lowered = name.lower()
        if lowered in _NOT_FORWARDED or lowered in named:
            if lowered == b"connection" and not named and (found := connection_named(headers)):
                return _head(method, target, origin, headers, body, found)  # rare: once more
            continue
        if lowered == b"authorization" and origin.authorization is not None:
            continue
        parts += (b"\r\n", name, b": ", value)
        lines += 1
    if origin.authorization is not None:
        parts += (b"\r\nauthorization: ", origin.authorization)
        lines += 1
    if isinstance(body, bytes) and body:
        parts.append(b"\r\ncontent-length: %d" % len(body))
        lines += 1
    elif body is None or isinstance(body, bytes):
        if method not in _BODYLESS:
            parts.append(b"\r\ncontent-length: 0")
            lines += 1
    else:
        parts.append(b"\r\ntransfer-encoding: chunked")
        lines += 1
    parts.append(b"\r\n\r\n")
    head = b"".join(parts)
    if head.count(b"\n") != lines or head.count(b"\r") != lines:
        raise ValueError("a header's name or value holds a line break")
    return head
