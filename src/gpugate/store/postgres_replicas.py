"""The replica methods of the PostgreSQL store: a mixin of
:class:`gpugate.store.postgres.PostgresStore` (see :mod:`gpugate.store.replicas`)."""

from __future__ import annotations

import asyncio
from datetime import UTC, timedelta
from typing import TYPE_CHECKING

from gpugate.store.postgres_jobs import JOBS_CHANNEL
from gpugate.store.replicas import CLAIM_MARK, NamedReplica, Replica, claim_holder

if TYPE_CHECKING:
    from contextlib import AbstractAsyncContextManager

    import psycopg
    from psycopg.rows import TupleRow

    from gpugate.clock import Clock

    Connection = psycopg.AsyncConnection[TupleRow]

_HEARTBEAT = """
INSERT INTO gateway_replicas (id, started_at, last_seen) VALUES (%(id)s, %(now)s, %(now)s)
ON CONFLICT (id) DO UPDATE SET last_seen = excluded.last_seen"""
# A claim's replica is what follows the mark in leased_by (slugs hold no '@').
_RECLAIM = """
UPDATE jobs SET lease_expires_at = %(now)s
WHERE state = 'dispatching' AND lease_expires_at > %(now)s
  AND strpos(leased_by, %(mark)s) > 0
  AND split_part(leased_by, '@', 2) IN (
      SELECT id FROM gateway_replicas WHERE last_seen < %(cutoff)s AND id <> %(id)s)
RETURNING split_part(leased_by, '@', 2)"""
_REPLICAS = "SELECT id, started_at, last_seen FROM gateway_replicas ORDER BY last_seen DESC"
# A replica's claims (the jobs_lease index: every claim has an expiry).
_CLAIMS = """
SELECT slug, lease_token FROM jobs
WHERE lease_expires_at IS NOT NULL AND state = 'dispatching' AND leased_by = slug || %(holder)s"""
_WAKE = f"SELECT pg_notify('{JOBS_CHANNEL}', slug) FROM unnest(%(slugs)s::text[]) AS slug"  # noqa: S608 - a constant


class PostgresReplicas(NamedReplica):
    """The :class:`gpugate.store.replicas.ReplicaStore` methods of PostgreSQL."""

    _clock: Clock

    if TYPE_CHECKING:

        def _transaction(
            self, *, single: bool = False
        ) -> AbstractAsyncContextManager[Connection]: ...

        async def release(self, slug: str, token: str, *, actor: str = ...) -> bool: ...

    async def heartbeat(self) -> None:
        params = {"id": self._replica, "now": self._clock.now()}
        async with self._transaction(single=True) as conn:
            await conn.execute(_HEARTBEAT, params)

    async def reclaim_silent(self, silent_s: float) -> list[str]:
        now = self._clock.now()
        params: dict[str, object] = {"now": now, "cutoff": now - timedelta(seconds=silent_s)}
        params |= {"mark": CLAIM_MARK, "id": self._replica}
        async with self._transaction(single=True) as conn:
            rows = await (await conn.execute(_RECLAIM, params)).fetchall()
        return sorted({row[0] for row in rows})

    async def replicas(self) -> list[Replica]:
        async with self._transaction(single=True) as conn:
            rows = await (await conn.execute(_REPLICAS)).fetchall()
        return [Replica(r[0], r[1].astimezone(UTC), r[2].astimezone(UTC)) for r in rows]

    async def release_replica(self, replica_id: str) -> list[str]:
        async with self._transaction(single=True) as conn:
            cur = await conn.execute(_CLAIMS, {"holder": claim_holder(replica_id)})
            claims = await cur.fetchall()
        done = await asyncio.gather(*(self.release(slug, token) for slug, token in claims))
        released = sorted(slug for (slug, _), ok in zip(claims, done, strict=True) if ok)
        if released:
            async with self._transaction(single=True) as conn:
                await conn.execute(_WAKE, {"slugs": released})
        return released
