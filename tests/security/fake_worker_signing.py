"""Something that answers a gateway's status poll at a push worker's address without the
runtime's key: a forger (or any other program that took the port) claiming a call completed."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from push.fake_worker import FakeWorker


@contextlib.asynccontextmanager
async def forged_worker() -> AsyncIterator[FakeWorker]:
    """A fake worker without the secret that says every call completed with its result."""
    async with FakeWorker() as forger:
        forger.statuses["call-1"] = {"state": "completed", "result": {"text": "forged"}}
        yield forger
