"""PostgreSQL: how many times a write waits for the server (issue #14 defect 6).

A job's answer is at risk until its ``COMMIT`` reaches the server (the at-least-once window,
``docs/jobs.md``); each round trip before that is a turn of a loaded event loop. A loopback
proxy in front of the server counts the round trips: each time the client sends again after the
server answered. The store is opened with ``sslmode=disable`` so the proxy sees plain bytes.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING
from urllib.parse import urlsplit, urlunsplit

import pytest

from gpugate.errors import StoreError
from gpugate.store import NewJob
from gpugate.store.factory import open_store

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from gpugate.clock import ManualClock
    from gpugate.store import Store

    from .conftest import Target

pytestmark = pytest.mark.postgres


class RoundTrips:
    """A loopback TCP proxy to the server; ``count`` is the client's sends that followed an
    answer of the server (on any of its connections): the round trips the client waited for."""

    def __init__(self, host: str, port: int) -> None:
        self._target = host, port
        self._answered: set[int] = set()  # connections the server answered since the last send
        self.count = 0
        self.port = 0

    async def _pipe(
        self, conn: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, up: bool
    ) -> None:
        with contextlib.suppress(ConnectionError):
            while data := await reader.read(65536):
                if up and conn in self._answered:
                    self._answered.discard(conn)
                    self.count += 1
                elif not up:
                    self._answered.add(conn)
                writer.write(data)
                await writer.drain()
        writer.close()

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        server_reader, server_writer = await asyncio.open_connection(*self._target)
        conn = id(writer)
        await asyncio.gather(
            self._pipe(conn, reader, server_writer, up=True),
            self._pipe(conn, server_reader, writer, up=False),
        )

    @contextlib.asynccontextmanager
    async def serving(self) -> AsyncIterator[RoundTrips]:
        server = await asyncio.start_server(self._client, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        async with server:
            yield self


@pytest.fixture
async def counted(
    postgres_target: Target, clock: ManualClock
) -> AsyncIterator[tuple[Store, RoundTrips]]:
    """A migrated PostgreSQL store whose every connection goes through a :class:`RoundTrips`."""
    url = urlsplit(postgres_target.dsn)
    async with RoundTrips(url.hostname or "127.0.0.1", url.port or 5432).serving() as trips:
        netloc = (
            f"{url.username}@127.0.0.1:{trips.port}" if url.username else f"127.0.0.1:{trips.port}"
        )
        query = f"{url.query}&sslmode=disable&gssencmode=disable".lstrip("&")
        store = open_store(urlunsplit(url._replace(netloc=netloc, query=query)), clock=clock)
        await store.open()
        try:
            await store.migrate()
            yield store, trips
        finally:
            await store.close()


async def running(store: Store) -> tuple[str, str]:
    """A job whose call ``c-1`` runs on ``home-1``: its slug and lease token."""
    job, _ = await store.create_job(NewJob(model="qwen-35b", input={"p": "hi"}, runner="home-1"))
    lease = await store.claim_job(job.slug, lease_s=600)
    assert lease is not None
    assert lease.lease_token is not None
    token = lease.lease_token
    done = await store.record_submit(
        job.slug, token, runtime="home-1", call_id="c-1", lease_s=60, running=True
    )
    assert done
    return job.slug, token


async def test_a_completion_is_committed_in_two_round_trips_the_commit_sent_with_the_write(
    counted: tuple[Store, RoundTrips],
) -> None:
    """BEGIN goes with the locking read, COMMIT with the write (were four: one each)."""
    store, trips = counted
    slug, token = await running(store)
    before = trips.count

    assert await store.complete(slug, token, result={"ok": True}, actor="worker:home-1")

    assert 2 == trips.count - before
    job = await store.get_job(slug)
    assert job is not None
    assert ("completed", {"ok": True}) == (job.state, job.result)


async def test_a_write_the_server_refuses_rolls_back_and_leaves_the_connection_usable(
    counted: tuple[Store, RoundTrips],
) -> None:
    """A write that fails inside the pipelined transaction answers StoreError, nothing of it
    stays, and the next write on the pool's connection works."""
    store, _ = counted
    slug, token = await running(store)

    with pytest.raises(StoreError):  # jsonb holds no \\u0000: the server refuses the write
        await store.complete(slug, token, result={"text": "a\x00b"}, actor="worker:home-1")

    job = await store.get_job(slug)
    assert job is not None
    assert "running" == job.state
    assert await store.complete(slug, token, result={"ok": True}, actor="worker:home-1")
