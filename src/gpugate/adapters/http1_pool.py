"""The connection pools of :mod:`gpugate.adapters.http1`: one per origin, a limit across them,
and :func:`exchange`, which sends one request and waits for its head (a stale pooled connection
retried once on a fresh one).
"""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass

from gpugate.adapters.http1 import (
    ConnectFailed,
    Connection,
    ConnectTimedOut,
    HeadDeadlines,
    HeadFailed,
    HeadTimedOut,
    Response,
    Stale,
)
from gpugate.errors import UpstreamError


@dataclass(frozen=True, slots=True)
class Timeouts:
    """Per-request limits, in seconds."""

    connect_s: float
    first_byte_s: float
    total_s: float


class Limit:
    """At most ``limit`` connections in use across the pools (0: no limit); the rest wait, first
    come first served, each for as long as its request's deadline allows."""

    __slots__ = ("_waiters", "in_use", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.in_use = 0
        self._waiters: deque[asyncio.Future[None]] = deque()

    def try_acquire(self) -> bool:
        """A slot at once, if one is free and nobody waits for one."""
        if not self.limit or (self.in_use < self.limit and not self._waiters):
            self.in_use += 1
            return True
        return False

    async def acquire(self) -> None:
        """A slot, waiting in line for it if need be."""
        if self.try_acquire():
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter  # the slot is handed over by release(): in_use already counts it
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self.release()  # granted as we were cancelled: pass it on
            elif waiter in self._waiters:  # release() may have passed over it already
                self._waiters.remove(waiter)
            raise

    def release(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self.in_use -= 1


class Pool:
    """The connections to one origin: the idle ones, and how to make more."""

    __slots__ = (
        "_busy",
        "_idle",
        "_limit",
        "_sweeper",
        "heads",
        "host",
        "keepalive_s",
        "loop",
        "max_idle",
        "port",
        "server_hostname",
        "ssl",
    )

    def __init__(
        self,
        host: str,
        port: int,
        *,
        ssl_context: ssl.SSLContext | None,
        limit: Limit,
        keepalive_s: float,
        max_idle: int,
    ) -> None:
        self.host, self.port, self.ssl = host, port, ssl_context
        self.server_hostname = host if ssl_context is not None else None
        self.keepalive_s, self.max_idle = keepalive_s, max_idle
        self._limit = limit
        self._idle: list[Connection] = []
        self._busy: set[Connection] = set()
        self._sweeper: asyncio.TimerHandle | None = None
        self.loop = asyncio.get_running_loop()
        self.heads = HeadDeadlines(self.loop)  # the first-byte deadlines of its exchanges

    def take(self) -> Connection | None:
        """The most recently used idle connection still fit, or None; the expired are closed."""
        idle = self._idle
        oldest_kept = self.loop.time() - self.keepalive_s
        while idle:
            conn = idle.pop()
            if conn.idle() and conn.idle_since > oldest_kept:
                conn.reused = True
                self._busy.add(conn)
                return conn
            conn.close()
        return None

    async def connect(self) -> Connection:
        """A new connection (counted busy); :class:`ConnectFailed` when there is none."""
        try:
            _, conn = await self.loop.create_connection(
                lambda: Connection(self),
                self.host,
                self.port,
                ssl=self.ssl,
                server_hostname=self.server_hostname,
            )
        except OSError as exc:  # refused, unreachable, DNS, TLS (ssl.SSLError is an OSError)
            raise ConnectFailed(exc) from exc
        if conn.closed:  # lost between connection_made and here
            raise ConnectFailed(ConnectionResetError("the connection closed at once"))
        self._busy.add(conn)
        return conn

    def done(self, conn: Connection, *, keep: bool) -> None:
        """``conn``'s response is complete: back to the idle list, or closed."""
        if conn not in self._busy:
            return
        self._busy.discard(conn)
        self._limit.release()
        transport = conn.transport
        if (
            keep
            and conn.idle()
            and transport is not None
            and not transport.get_write_buffer_size()  # the whole request went out
            and len(self._idle) < self.max_idle
        ):
            conn.idle_since = self.loop.time()
            self._idle.append(conn)
            if self._sweeper is None:
                self._sweeper = self.loop.call_later(self.keepalive_s, self._sweep)
        else:
            conn.close()

    def lost(self, conn: Connection) -> None:
        """``conn`` closed (either side): forget it; a busy one frees its slot."""
        if conn in self._busy:
            self._busy.discard(conn)
            self._limit.release()
        elif conn in self._idle:
            self._idle.remove(conn)

    def _sweep(self) -> None:
        """Close the connections idle longer than ``keepalive_s``; again while any is idle."""
        self._sweeper = None
        oldest_kept = self.loop.time() - self.keepalive_s
        for conn in [c for c in self._idle if c.idle_since <= oldest_kept]:
            conn.close()  # removes it from the idle list
        if self._idle:
            self._sweeper = self.loop.call_later(self.keepalive_s / 2, self._sweep)

    async def open(self, connect_s: float, deadline: float, *, reuse: bool) -> Connection:
        """A connection to carry a request (an idle one when ``reuse``), holding one of the
        limit's slots; :class:`HeadTimedOut` at ``deadline`` (loop time)."""
        if not self._limit.try_acquire():
            try:
                async with asyncio.timeout_at(deadline):
                    await self._limit.acquire()
            except TimeoutError:
                raise HeadTimedOut from None
        conn = self.take() if reuse else None
        if conn is not None:
            return conn
        connect_deadline = self.loop.time() + connect_s
        try:
            async with asyncio.timeout_at(min(connect_deadline, deadline)):
                return await self.connect()
        except TimeoutError:
            self._limit.release()
            if connect_deadline <= deadline:
                raise ConnectTimedOut from None
            raise HeadTimedOut from None
        except BaseException:
            self._limit.release()
            raise

    def empty(self) -> bool:
        return not self._idle and not self._busy

    def close(self) -> None:
        self.heads.close()
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        for conn in [*self._idle, *self._busy]:
            if conn.response is not None:
                conn.response.got_failure(UpstreamError("the client was closed"))
                conn.response = None
            conn.close()

    def __repr__(self) -> str:
        return f"<Pool {self.host}:{self.port} idle={len(self._idle)} busy={len(self._busy)}>"


async def exchange(
    pool: Pool,
    response: Response,
    head: bytes,
    body: bytes | AsyncIterator[bytes] | None,
    timeouts: Timeouts,
    *,
    head_only: bool = False,
) -> None:
    """Send one request on ``pool`` and return once ``response`` has its head.

    Raises :class:`ConnectFailed` / :class:`ConnectTimedOut` (nothing reached the upstream),
    :class:`HeadTimedOut` (no head within ``first_byte_s`` of now, connecting and waiting for a
    free connection included) or :class:`HeadFailed`."""
    started = pool.loop.time()
    deadline = started + timeouts.first_byte_s
    retry = body is None or isinstance(body, bytes)  # an iterator's pieces are gone once sent
    conn = await pool.open(timeouts.connect_s, deadline, reuse=True)
    while True:
        writing = conn.send(response, head, body, head_only=head_only)
        try:
            await response.wait_head(deadline, pool.heads)
        except Stale as exc:
            if writing is not None:
                writing.cancel()
            if not retry:
                raise HeadFailed(str(exc)) from exc
            retry = False
            response.reset()  # nothing of it was seen: start over, once
            conn = await pool.open(timeouts.connect_s, deadline, reuse=False)
            continue
        except BaseException:
            if writing is not None:
                writing.cancel()
            conn.close()  # a busy connection: frees its slot
            raise
        break
    response.arm(started + timeouts.total_s)
