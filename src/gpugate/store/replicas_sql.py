"""The replica methods (:mod:`gpugate.store.replicas`), once for both backends."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import TYPE_CHECKING

from gpugate.store.dialect import only_postgres, sql
from gpugate.store.replicas import NamedReplica, Replica
from gpugate.store.tx import Driven, rows

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from gpugate.store.tx import Tx

_HEARTBEAT = sql("""
INSERT INTO gateway_replicas (id, started_at, last_seen) VALUES (:id, :now, :now)
ON CONFLICT (id) DO UPDATE SET last_seen = excluded.last_seen""")
_RECLAIM = sql("""
UPDATE jobs SET lease_expires_at = :now
WHERE state = 'dispatching' AND lease_expires_at > :now AND lease_kind = 'claim'
  AND lease_replica IN (SELECT id FROM gateway_replicas WHERE last_seen < :cutoff AND id <> :id)
RETURNING lease_replica""")
_REPLICAS = sql("SELECT id, started_at, last_seen FROM gateway_replicas ORDER BY last_seen DESC")
# A replica's claims (the jobs_lease index: every claim has an expiry).
_CLAIMS = sql("""
SELECT slug, lease_token FROM jobs
WHERE lease_expires_at IS NOT NULL AND state = 'dispatching' AND lease_kind = 'claim'
  AND lease_replica = :replica""")
# The other replicas' dispatchers are woken as for a new job (LISTEN in watch_jobs).
WAKE = only_postgres("SELECT pg_notify('gpugate_jobs', slug) FROM unnest(:slugs::text[]) AS slug")


def _wake(slugs: list[str]) -> Tx[list[str]]:
    if slugs:
        yield from rows(WAKE, {"slugs": slugs})
    return slugs


class ReplicasSql(NamedReplica, Driven):
    """The :class:`gpugate.store.replicas.ReplicaStore` methods."""

    if TYPE_CHECKING:
        release: Callable[..., Awaitable[bool]]  # JobStore.release, from the jobs part

    async def heartbeat(self) -> None:
        params = {"id": self._replica, "now": self._clock.now()}
        await self._transact(rows(_HEARTBEAT, params), single=True)

    async def reclaim_silent(self, silent_s: float) -> list[str]:
        now = self._clock.now()
        params: dict[str, object] = {"now": now, "cutoff": now - timedelta(seconds=silent_s)}
        params["id"] = self._replica
        found = await self._transact(rows(_RECLAIM, params), single=True)
        return sorted({row[0] for row in found})

    async def replicas(self) -> list[Replica]:
        c, found = self._codec, await self._query(rows(_REPLICAS))
        return [Replica(r[0], c.time(r[1]), c.time(r[2])) for r in found]

    async def release_replica(self, replica_id: str) -> list[str]:
        claims = await self._query(rows(_CLAIMS, {"replica": replica_id}))
        done = await asyncio.gather(*(self.release(slug, token) for slug, token in claims))
        released = sorted(slug for (slug, _), ok in zip(claims, done, strict=True) if ok)
        return await self._transact(_wake(released), single=True)
