"""One aiohttp application served on a local TCP port, started and stopped on demand."""

from __future__ import annotations

import socket
import struct
from typing import TYPE_CHECKING

from aiohttp import web

if TYPE_CHECKING:
    from collections.abc import Callable

_SHUTDOWN_S = 0.1


class LocalSite:
    """Serves applications built by `make_app` on `host:port` (port 0 = a free port).

    `stop` is prompt: a handler still running after `shutdown_s` (a hung request, a stream) is
    cancelled and its connection closed. `start` again reuses the port it had.
    """

    __slots__ = ("_host", "_make_app", "_port", "_runner", "_shutdown_s")

    def __init__(
        self, make_app: Callable[[], web.Application], *, shutdown_s: float = _SHUTDOWN_S
    ) -> None:
        self._make_app = make_app
        self._shutdown_s = shutdown_s
        self._runner: web.AppRunner | None = None
        self._host = "127.0.0.1"
        self._port = 0

    def __repr__(self) -> str:
        state = f"running on {self.url}" if self.running else "stopped"
        return f"<LocalSite {state}>"

    @property
    def running(self) -> bool:
        return self._runner is not None

    @property
    def url(self) -> str:
        """``http://host:port`` of the running site."""
        if self._runner is None:
            raise RuntimeError("the site is not running")
        return f"http://{self._host}:{self._port}"

    @property
    def port(self) -> int:
        return self._port

    @property
    def last_url(self) -> str:
        """``http://host:port`` it serves or served last (for a site stopped for a while)."""
        return f"http://{self._host}:{self._port}"

    async def start(
        self, host: str | None = "127.0.0.1", port: int | socket.socket | None = None
    ) -> str:
        """Serve on `host:port` (port default: the previous port, else a free one; host None:
        the previous host); returns the URL. `port` may be a socket the caller bound on `host`
        (so a taken port fails where it was bound): the site serves on it and closes it."""
        if self._runner is not None:
            raise RuntimeError("the site is already running")
        runner = web.AppRunner(
            self._make_app(),
            handler_cancellation=True,
            access_log=None,
            shutdown_timeout=self._shutdown_s,
        )
        await runner.setup()
        host = self._host if host is None else host
        try:
            site: web.BaseSite
            if isinstance(port, socket.socket):
                site = web.SockSite(runner, port)
            else:
                site = web.TCPSite(runner, host, self._port if port is None else port)
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        self._host = host
        self._port = int(runner.addresses[0][1])
        return self.url

    async def stop(self) -> None:
        """Stop serving and close every connection (idempotent)."""
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()


def abort(request: web.BaseRequest) -> None:
    """Abort the request's TCP connection with a reset (RST), not a clean close."""
    transport = request.transport
    if transport is None:
        return
    sock = transport.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()
