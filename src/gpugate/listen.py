"""Binding a listening socket: a taken port is one clear :class:`ListenError`, not a traceback.

Every process gpugate starts binds its listeners here first (``serve``, ``demo``, ``worker``,
``fleet``), before anything else starts, so ``gpugate: error: cannot listen on HOST:PORT:
address already in use`` is the whole of the failure. Foundation: the standard library and
:mod:`gpugate.errors` only, so the push worker (a separate program) can use it too.
"""

from __future__ import annotations

import errno
import socket

from gpugate.errors import ListenError


def bind(host: str, port: int, *, reuse_port: bool = False, listen: bool = True) -> socket.socket:
    """A listening socket on host:port, or a :class:`ListenError` that says what is wrong.

    ``reuse_port``: ``SO_REUSEPORT``, so every worker of ``serve --workers`` binds the address
    itself and the kernel spreads the connections among them; ``listen=False`` leaves the
    socket bound only (it gets no connection until the event loop starts serving on it, which
    listens: a worker takes no connection before its gateway is built)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, True)  # noqa: FBT003
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, True)  # noqa: FBT003
        sock.bind((host, port))
        if listen:
            sock.listen(2048)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise ListenError(f"cannot listen on {host}:{port}: address already in use") from exc
        if exc.errno == errno.EADDRNOTAVAIL:
            raise ListenError(f"cannot listen on {host}:{port}: no such local address") from exc
        raise ListenError(f"cannot listen on {host}:{port}: {exc.strerror}") from exc
    sock.setblocking(False)  # noqa: FBT003
    return sock
