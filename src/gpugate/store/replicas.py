"""The replicas of a shared store: who is alive, and taking back the claims of who is not.

Every gateway process names itself (:func:`replica_id`) and heartbeats (:meth:`heartbeat`). On
PostgreSQL a dispatcher claim carries its replica's name (``leased_by =
'<slug>-dispatcher@<replica>'``), so :meth:`reclaim_silent` can end, at once, the claims of a
replica silent for longer than ``silent_s`` — the reaper then takes those jobs back at its next
pass, within a minute of the replica's death rather than the 600 s of the dispatcher lease
(DESIGN §5.3). A SQLite store has one process: its claims name no replica and are taken back at
start-up instead, so there :meth:`reclaim_silent` finds nothing.
"""

from __future__ import annotations

import os
import re
import secrets
import socket
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from gpugate.core.lease import CLAIM_MARK


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


class ReplicaStore(Protocol):
    """The replica methods every store backend implements."""

    @property
    def replica(self) -> str:
        """This store's replica name (the process's)."""
        ...

    async def heartbeat(self) -> None:
        """Record that this replica is alive now."""
        ...

    async def reclaim_silent(self, silent_s: float) -> list[str]:
        """End now the dispatcher claims of every replica not heard of for ``silent_s``;
        the replicas whose claims were ended (each once)."""
        ...

    async def replicas(self) -> list[Replica]:
        """Every replica heard of, most recently seen first."""
        ...

    async def release_replica(self, replica_id: str) -> list[str]:
        """Put every job that ``replica_id`` holds as a dispatcher claim back in the queue
        now (event ``released``, as :meth:`JobStore.release`; no rescue is counted): what a
        replica that stops on purpose hands back, so another takes those jobs at once rather
        than after its silence is noticed. The slugs released, sorted; other replicas are woken
        (PostgreSQL: ``NOTIFY``, as for a new job)."""
        ...


class NamedReplica:
    """The replica name a store was opened with, and the ``leased_by`` tail of its claims."""

    _replica: str

    @property
    def replica(self) -> str:
        return self._replica

    @property
    def _holder(self) -> str:
        return claim_holder(self._replica)


def claim_holder(replica_id: str) -> str:
    """What follows a job's slug in ``leased_by`` while ``replica_id`` holds it as a claim."""
    return CLAIM_MARK + replica_id
