"""The replica methods of the SQLite store: a mixin of :class:`gpugate.store.sqlite.SqliteStore`
(see :mod:`gpugate.store.replicas`; one process owns a SQLite store, so this is mostly a record
of who opened it, and its reclaim finds another replica's claims only in a test)."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import TYPE_CHECKING, TypeVar

from gpugate.store.replicas import CLAIM_MARK, NamedReplica, Replica, claim_holder
from gpugate.store.sqlite_codec import text_time, time_text

if TYPE_CHECKING:
    import sqlite3
    from collections.abc import Callable

    from gpugate.clock import Clock

T = TypeVar("T")

_HEARTBEAT = """
INSERT INTO gateway_replicas (id, started_at, last_seen) VALUES (:id, :now, :now)
ON CONFLICT (id) DO UPDATE SET last_seen = excluded.last_seen"""
# A claim's replica is what follows the mark in leased_by (slugs hold no '@').
_RECLAIM = """
UPDATE jobs SET lease_expires_at = :now
WHERE state = 'dispatching' AND lease_expires_at > :now AND instr(leased_by, :mark) > 0
  AND substr(leased_by, instr(leased_by, '@') + 1) IN (
      SELECT id FROM gateway_replicas WHERE last_seen < :cutoff AND id <> :id)
RETURNING substr(leased_by, instr(leased_by, '@') + 1)"""
_REPLICAS = "SELECT id, started_at, last_seen FROM gateway_replicas ORDER BY last_seen DESC"
_CLAIMS = """
SELECT slug, lease_token FROM jobs
WHERE lease_expires_at IS NOT NULL AND state = 'dispatching' AND leased_by = slug || :holder"""


class SqliteReplicas(NamedReplica):
    """The :class:`gpugate.store.replicas.ReplicaStore` methods of the SQLite store."""

    _clock: Clock

    if TYPE_CHECKING:

        async def _read(self, work: Callable[[sqlite3.Connection], T]) -> T: ...

        async def _write(self, work: Callable[[sqlite3.Connection], T]) -> T: ...

        async def release(self, slug: str, token: str, *, actor: str = ...) -> bool: ...

    async def heartbeat(self) -> None:
        params = {"id": self._replica, "now": time_text(self._clock.now())}
        await self._write(lambda conn: conn.execute(_HEARTBEAT, params))

    async def reclaim_silent(self, silent_s: float) -> list[str]:
        now = self._clock.now()
        params = {"now": time_text(now), "mark": CLAIM_MARK, "id": self._replica}
        params["cutoff"] = time_text(now - timedelta(seconds=silent_s))

        def work(conn: sqlite3.Connection) -> list[str]:
            return sorted({row[0] for row in conn.execute(_RECLAIM, params).fetchall()})

        return await self._write(work)

    async def replicas(self) -> list[Replica]:
        rows = await self._read(lambda conn: conn.execute(_REPLICAS).fetchall())
        return [Replica(r[0], text_time(r[1]), text_time(r[2])) for r in rows]

    async def release_replica(self, replica_id: str) -> list[str]:
        params = {"holder": claim_holder(replica_id)}
        claims = await self._read(lambda conn: conn.execute(_CLAIMS, params).fetchall())
        done = await asyncio.gather(*(self.release(slug, token) for slug, token in claims))
        return sorted(slug for (slug, _), ok in zip(claims, done, strict=True) if ok)
