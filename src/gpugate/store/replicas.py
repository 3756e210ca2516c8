"""The replicas of a shared store: who is alive, and taking back the claims of who is not; once
for both backends.

Every gateway process names itself (:func:`replica_id`) and heartbeats (:meth:`heartbeat`). On
PostgreSQL a dispatcher claim carries its replica's name (``leased_by =
'<slug>-dispatcher@<replica>'``), and so do the call slot it reserves and a call that runs in
its process (an ``upstream`` runtime's), so :meth:`reclaim_silent` can end, at once, the leases
of a replica silent for longer than ``silent_s`` — the reaper then takes those jobs back at its
next pass, within a minute of the replica's death rather than the 600 s of the dispatcher lease
or the ``jobs.quiet_s`` of a call (DESIGN §5.3). A SQLite store has one process: its claims
name no replica and are taken back at start-up instead, so there :meth:`reclaim_silent` finds
nothing.
"""

from __future__ import annotations

import asyncio
import os
import re
import secrets
import socket
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Protocol

from gpugate.core.lease import CLAIM_MARK
from gpugate.store.dialect import only_postgres, sql
from gpugate.store.tx import Driven, read, rows

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from gpugate.store.tx import Tx


def replica_id() -> str:
    """A name for this process: host, pid and a random part (no ``:`` or ``@``)."""
    host = re.sub(r"[^A-Za-z0-9-]", "-", socket.gethostname())[:40] or "host"
    return f"{host}-{os.getpid()}-{secrets.token_hex(3)}"


@dataclass(frozen=True, slots=True)
class Replica:
    """One gateway process as the store last heard of it."""

    id: str
    started_at: datetime
    last_seen: datetime


_HEARTBEAT = sql("""
INSERT INTO gateway_replicas (id, started_at, last_seen) VALUES (:id, :now, :now)
ON CONFLICT (id) DO UPDATE SET last_seen = excluded.last_seen""")
# Every lease that names a replica: a dispatcher's claim, the slot it reserved before its
# submit (the claim's replica stays on the row), a call that runs in its process (upstream).
_RECLAIM = sql("""
UPDATE jobs SET lease_expires_at = :now
WHERE state IN ('dispatching', 'running') AND lease_expires_at > :now
  AND lease_kind IN ('claim', 'reservation', 'call')
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


class ReplicaStore(Driven, Protocol):
    """The replica methods of :class:`gpugate.store.Store`."""

    if TYPE_CHECKING:
        release: Callable[..., Awaitable[bool]]  # JobStore.release, from the jobs part

    @property
    def replica(self) -> str:
        """This store's replica name (the process's)."""
        return self._replica

    @property
    def _holder(self) -> str:
        """What follows a job's slug in ``leased_by`` while this replica holds it as a claim."""
        return CLAIM_MARK + self._replica

    async def heartbeat(self) -> None:
        """Record that this replica is alive now."""
        params = {"id": self._replica, "now": self._clock.now()}
        await self._transact(rows(_HEARTBEAT, params), single=True)

    async def reclaim_silent(self, silent_s: float) -> list[str]:
        """End now the leases of every replica not heard of for ``silent_s`` (its dispatcher
        claims, their slot reservations, its in-process calls); the replicas whose leases were
        ended (each once)."""
        now = self._clock.now()
        params: dict[str, object] = {"now": now, "cutoff": now - timedelta(seconds=silent_s)}
        params["id"] = self._replica
        found = await self._transact(rows(_RECLAIM, params), single=True)
        return sorted({row[0] for row in found})

    async def replicas(self) -> list[Replica]:
        """Every replica heard of, most recently seen first."""
        return [read(self._codec, Replica, row) for row in await self._query(rows(_REPLICAS))]

    async def release_replica(self, replica_id: str) -> list[str]:
        """Put every job that ``replica_id`` holds as a dispatcher claim back in the queue
        now (event ``released``, as :meth:`JobStore.release`; no rescue is counted): what a
        replica that stops on purpose hands back, so another takes those jobs at once rather
        than after its silence is noticed. The slugs released, sorted; other replicas are woken
        (PostgreSQL: ``NOTIFY``, as for a new job)."""
        claims = await self._query(rows(_CLAIMS, {"replica": replica_id}))
        done = await asyncio.gather(*(self.release(slug, token) for slug, token in claims))
        released = sorted(slug for (slug, _), ok in zip(claims, done, strict=True) if ok)
        return await self.wake_replicas(released)

    async def wake_replicas(self, slugs: list[str]) -> list[str]:
        """Wake every replica's dispatcher for these queued jobs, as a new job does
        (PostgreSQL: ``NOTIFY``; SQLite: nothing, its one process wakes its own); ``slugs``."""
        return await self._transact(_wake(slugs), single=True)
