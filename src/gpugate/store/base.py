"""The values a store hands back, and the semantics every backend of
:class:`gpugate.store.Store` keeps.

Two backends drive it: SQLite (one process, the embedded default) and PostgreSQL (many replicas
on one database). Both pass the same contract suite (``tests/store``).

Semantics every backend keeps:

* Config versions are numbered 1, 2, 3, ... without gaps or duplicates, even under concurrent
  savers; a save and its ``config.saved`` audit event commit together.
* Audit events are listed newest first; ``before_id`` is the cursor for the next page.
* Runtime states (:mod:`gpugate.store.runtime_state`): a change and its audit event commit
  together.
* Spend and call slots (:mod:`gpugate.store.ledger`): a reservation checks ``max_concurrency``
  and today's budget and takes both in one atomic step, across replicas.
* Idempotency keys: ``Store.idem_begin`` is one atomic step that either claims the key
  (:class:`Started`) or reports what holds it. A row past its ``expires_at`` counts as absent.
  Only the owner that started a key may complete or abandon it.
* Timestamps come from the injected clock, are stored as UTC and returned timezone-aware.
* Jobs (the :class:`~gpugate.store.jobs_sql.JobStore` part, with its values): one idempotency
  key makes at most one job, in every state; a claim hands each queued job to exactly one
  claimer; every write a lease holder makes is fenced by the lease's token; every state change
  appends its event in the same transaction.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from datetime import datetime

CONFIG_SAVED = "config.saved"
"""Audit action written with every ``Store.save_config``."""

CONFIG_SEEDED = "config.seeded"
"""Audit action written when ``Store.seed_config`` inserts version 1."""

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


def check_limit(limit: int) -> int:
    """A page size must be positive; backends differ on what a negative LIMIT means."""
    if limit < 1:
        raise ValueError(f"limit must be at least 1, got {limit}")
    return limit
