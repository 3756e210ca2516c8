"""Random url-safe tokens (job slugs, lease tokens, call ids) from pooled reads of the system's
randomness.

``secrets.token_urlsafe`` reads ``os.urandom`` once per token: a system call that releases the
GIL, and on the SQLite store's two threads (the event loop and the store's) a released GIL is
taken by the other thread and waited for — a job asked for two such tokens on the loop
(``bench/jobs.py``: ~10 % of the loop's samples). The bytes are the same CSPRNG output, read
4 KiB at a time; a forked child (``serve --workers N``) starts with an empty pool, never its
parent's bytes.
"""

from __future__ import annotations

import base64
import os
import threading

_BLOCK = 4096


class _Pool:
    __slots__ = ("_at", "_bytes", "_lock")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._bytes = b""
        self._at = 0

    def take(self, count: int) -> bytes:
        with self._lock:
            if self._at + count > len(self._bytes):
                self._bytes, self._at = os.urandom(max(_BLOCK, count)), 0
            start = self._at
            self._at = start + count
            return self._bytes[start : self._at]

    def forget(self) -> None:
        """In a forked child: no bytes of the parent's, and a lock no parent thread holds."""
        self._lock = threading.Lock()
        self._bytes, self._at = b"", 0


_POOL = _Pool()
os.register_at_fork(after_in_child=_POOL.forget)


def token_bytes(count: int) -> bytes:
    """``count`` random bytes, as :func:`secrets.token_bytes` (from the pool)."""
    return _POOL.take(count)


def token_urlsafe(count: int) -> str:
    """``count`` random bytes as url-safe base64 without padding, as
    :func:`secrets.token_urlsafe`."""
    return base64.urlsafe_b64encode(_POOL.take(count)).rstrip(b"=").decode()
