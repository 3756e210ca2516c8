"""Free loopback ports for a server the test starts in another process.

A port is free when asked and may be taken by the time the child binds it (nothing holds it in
between); the rigs that start a child and wait for it to answer say so when it does not come
up. In-process servers bind port 0 and read their port back instead.
"""

from __future__ import annotations

import socket


def free_ports(count: int) -> list[int]:
    """``count`` distinct free ports (held together while chosen, so they differ)."""
    socks = [socket.socket() for _ in range(count)]
    try:
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in socks]
    finally:
        for sock in socks:
            sock.close()


def free_port() -> int:
    """One free port (the gateway's URL must be known before its config is written)."""
    return free_ports(1)[0]
