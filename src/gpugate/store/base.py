"""What gpugate asks of a store, and the values a store hands back.

Two backends implement :class:`Store`: SQLite (one process, the embedded default) and PostgreSQL
(many replicas on one database). Both pass the same contract suite (``tests/store``).

Semantics every backend keeps:

* Config versions are numbered 1, 2, 3, ... without gaps or duplicates, even under concurrent
  savers; a save and its ``config.saved`` audit event commit together.
* Audit events are listed newest first; ``before_id`` is the cursor for the next page.
* Runtime states (:mod:`gpugate.store.runtime_state`): a change and its audit event commit
  together.
* Spend and call slots (:mod:`gpugate.store.ledger`): a reservation checks ``max_concurrency``
  and today's budget and takes both in one atomic step, across replicas.
* Idempotency keys: :meth:`Store.idem_begin` is one atomic step that either claims the key
  (:class:`Started`) or reports what holds it. A row past its ``expires_at`` counts as absent.
  Only the owner that started a key may complete or abandon it.
* Timestamps come from the injected clock, are stored as UTC and returned timezone-aware.
* Jobs (the :class:`~gpugate.store.jobs_base.JobStore` part, with its values): one idempotency
  key makes at most one job, in every state; a claim hands each queued job to exactly one
  claimer; every write a lease holder makes is fenced by the lease's token; every state change
  appends its event in the same transaction.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from gpugate.store.facade_base import FacadeStore
from gpugate.store.jobs_base import JobStore
from gpugate.store.keys import KeyStore
from gpugate.store.ledger import LedgerStore
from gpugate.store.replicas import ReplicaStore
from gpugate.store.retention import RetentionStore
from gpugate.store.runtime_state import RuntimeStateStore

if TYPE_CHECKING:
    from collections.abc import Sequence
    from datetime import datetime

CONFIG_SAVED = "config.saved"
"""Audit action written with every :meth:`Store.save_config`."""

CONFIG_SEEDED = "config.seeded"
"""Audit action written when :meth:`Store.seed_config` inserts version 1."""

CONFIG_SUBJECT = "config"
"""Audit subject of config events; the version is in the event's detail."""


@dataclass(frozen=True, slots=True)
class ConfigVersion:
    """One stored version of the gateway config."""

    version: int
    document: dict[str, Any]
    created_at: datetime
    actor: str
    note: str


@dataclass(frozen=True, slots=True)
class AuditEvent:
    """Something an operator or the gateway did, before it is stored."""

    actor: str
    action: str
    subject: str
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class AuditRecord:
    """A stored audit event; ``id`` grows with every append."""

    id: int
    at: datetime
    actor: str
    action: str
    subject: str
    detail: dict[str, Any]


@dataclass(frozen=True, slots=True)
class IdemRecord:
    """A completed response stored under an idempotency key, replayed byte for byte."""

    key: str
    fingerprint: str
    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes
    created_at: datetime
    expires_at: datetime


@dataclass(frozen=True, slots=True)
class Started:
    """The key was free (or expired): the caller owns it now and must complete or abandon it."""


@dataclass(frozen=True, slots=True)
class InFlight:
    """The key is held by a request that has not completed yet."""


@dataclass(frozen=True, slots=True)
class Replay:
    """The key completed with the same request: replay ``record``."""

    record: IdemRecord


@dataclass(frozen=True, slots=True)
class Mismatch:
    """The key is held (or completed) for a different request."""


IdemBegin = Started | InFlight | Replay | Mismatch


def request_fingerprint(method: str, path: str, body: bytes) -> str:
    """The sha256 hex digest that tells two requests under one idempotency key apart."""
    digest = hashlib.sha256()
    digest.update(method.upper().encode())
    digest.update(b"\n")
    digest.update(path.encode())
    digest.update(b"\n")
    digest.update(body)
    return digest.hexdigest()


def idem_verdict(
    fingerprint: str, held_fingerprint: str, completed: IdemRecord | None
) -> IdemBegin:
    """What :meth:`Store.idem_begin` answers for a key another request already holds."""
    if held_fingerprint != fingerprint:
        return Mismatch()
    if completed is None:
        return InFlight()
    return Replay(completed)


def check_limit(limit: int) -> int:
    """A page size must be positive; backends differ on what a negative LIMIT means."""
    if limit < 1:
        raise ValueError(f"limit must be at least 1, got {limit}")
    return limit


class Store(
    JobStore,
    RuntimeStateStore,
    FacadeStore,
    ReplicaStore,
    LedgerStore,
    RetentionStore,
    KeyStore,
    Protocol,
):
    """The durable state of a gateway: config versions, audit trail, idempotency records, jobs,
    runtime states, the façades' files and batches, the replicas sharing it, the spend ledger."""

    @property
    def backend(self) -> str:
        """``"sqlite"`` or ``"postgresql"``."""
        ...

    async def open(self) -> None:
        """Connect; raises StoreUnavailable (one line, no password) when unreachable."""
        ...

    async def close(self) -> None:
        """Release every connection; calling it twice is harmless."""
        ...

    async def ping(self) -> None:
        """Raises StoreUnavailable unless the store answers."""
        ...

    async def migrate(self) -> list[str]:
        """Apply pending migrations in order; returns the names applied (none when current)."""
        ...

    async def schema_version(self) -> int:
        """The newest applied migration, 0 on an empty database."""
        ...

    async def current_config(self) -> ConfigVersion | None:
        """The newest config version, None before the first is stored."""
        ...

    async def get_config(self, version: int) -> ConfigVersion | None:
        """One config version, None when there is no such version."""
        ...

    async def list_configs(self, limit: int = 50) -> list[ConfigVersion]:
        """Config versions, newest first."""
        ...

    async def save_config(
        self, document: dict[str, Any], *, actor: str, note: str
    ) -> ConfigVersion:
        """Store ``document`` as the next version and audit it, in one transaction."""
        ...

    async def seed_config(
        self, document: dict[str, Any], *, actor: str
    ) -> tuple[ConfigVersion, bool]:
        """Store ``document`` as version 1 unless a version exists; returns (current, seeded)."""
        ...

    async def append_audit(self, event: AuditEvent) -> AuditRecord:
        """Store one audit event."""
        ...

    async def list_audit(
        self,
        *,
        action: str | None = None,
        subject: str | None = None,
        limit: int = 100,
        before_id: int | None = None,
        actor: str | None = None,
        since: datetime | None = None,
    ) -> list[AuditRecord]:
        """Audit events, newest first, optionally filtered (every filter given must hold;
        ``since`` keeps events at or after that time); ``before_id`` pages further back."""
        ...

    async def idem_begin(
        self, key: str, fingerprint: str, *, ttl_s: float, owner: str
    ) -> IdemBegin:
        """Claim ``key`` for ``owner`` until now + ``ttl_s``, or say what holds it."""
        ...

    async def idem_complete(
        self,
        key: str,
        owner: str,
        status: int,
        headers: Sequence[tuple[str, str]],
        body: bytes,
        *,
        ttl_s: float | None = None,
    ) -> bool:
        """Store the response of the owner's in-flight key; False when it is not the owner's.

        ``ttl_s`` (optional) keeps the completed response for that long from now instead of
        the expiry set by :meth:`idem_begin`.
        """
        ...

    async def idem_abandon(self, key: str, owner: str) -> bool:
        """Drop the owner's in-flight key so a retry can start; False when nothing was dropped."""
        ...

    async def idem_purge_expired(self) -> int:
        """Delete every expired idempotency row; returns how many."""
        ...
