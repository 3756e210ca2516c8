"""The replica methods of the PostgreSQL store: a mixin of
:class:`gpugate.store.postgres.PostgresStore` (see :mod:`gpugate.store.replicas`)."""

from __future__ import annotations

from datetime import UTC, timedelta
from typing import TYPE_CHECKING

from gpugate.store.replicas import CLAIM_MARK, NamedReplica, Replica

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


class PostgresReplicas(NamedReplica):
    """The :class:`gpugate.store.replicas.ReplicaStore` methods of PostgreSQL."""

    _clock: Clock

    if TYPE_CHECKING:

        def _transaction(
            self, *, single: bool = False
        ) -> AbstractAsyncContextManager[Connection]: ...

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
