"""Client keys, their limit counters and their usage in the store (issue #16).

Semantics every backend keeps:

* A key is stored with the SHA-256 of its secret (``digest``, unique), never the secret. A
  create, update, rotation or revocation and its audit event commit together.
* :meth:`KeyStore.reserve_quota` is one decision across replicas: it locks the key's row, reads
  its counters, checks every limit (:func:`gpugate.core.limits.over_limit`) and adds the
  estimate, in one transaction; two replicas never both take the last unit.
* :meth:`KeyStore.settle_quota` replaces a reservation's estimate with what was used (or gives
  it back) in the windows it was reserved in, and frees its concurrency slot.
* Usage rows add up per (day, key, model, upstream).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime
from typing import Any, Protocol

from gpugate.core.classes import RequestClass
from gpugate.core.keys import ClientKey, Limits
from gpugate.core.limits import Estimate, Slice, Windows

KEY_CREATED = "key.created"
KEY_UPDATED = "key.updated"
KEY_ROTATED = "key.rotated"
KEY_REVOKED = "key.revoked"
KEY_LIMITED = "key.limited"
CONCURRENCY_SPAN = "c"


def minute_span(windows: Windows) -> str:
    return "m:" + windows.minute


def day_span(windows: Windows) -> str:
    return "d:" + windows.day


@dataclass(frozen=True, slots=True)
class UsageRow:
    """Usage of one key on one model and upstream on one UTC day."""

    day: date
    key_id: str
    tenant: str
    model: str
    upstream: str
    requests: int
    prompt_tokens: int
    completion_tokens: int
    cents: float


def key_fields(key: ClientKey) -> dict[str, Any]:
    """A key's stored fields that are neither JSON nor time (each backend encodes the rest)."""
    return {
        "id": key.id,
        "name": key.name,
        "tenant": key.tenant,
        "prefix": key.prefix,
        "max_class": key.max_class.value,
        "allow_external": key.allow_external,
    }


def audit_detail(key: ClientKey) -> dict[str, Any]:
    """What an audit event says of a key: everything but its secret (which is not stored)."""
    return {
        "name": key.name,
        "tenant": key.tenant,
        "prefix": key.prefix,
        "models": None if key.models is None else list(key.models),
        "max_class": key.max_class.value,
        "runners": None if key.runners is None else list(key.runners),
        "allow_external": key.allow_external,
        "limits": key.limits.as_dict(),
        "expires_at": None if key.expires_at is None else key.expires_at.isoformat(),
    }


ALIVE_S = 30.0
"""A replica heard of within this long still holds its concurrency slots (a dead one's go)."""


def usage_params(row: UsageRow) -> dict[str, Any]:
    """The bound values of one usage row's upsert (the day as the backend's driver takes it)."""
    return {
        "day": row.day,
        "key_id": row.key_id,
        "tenant": row.tenant,
        "model": row.model,
        "upstream": row.upstream,
        "requests": row.requests,
        "prompt": row.prompt_tokens,
        "completion": row.completion_tokens,
        "cents": row.cents,
    }


def key_of(
    row: tuple[Any, ...],
    *,
    models: Any,
    runners: Any,
    limits: Any,
    times: tuple[datetime | None, datetime | None, datetime | None],
) -> ClientKey:
    """A :class:`ClientKey` from a row of the key columns, its JSON and times decoded."""
    expires_at, created_at, revoked_at = times
    return ClientKey(
        id=row[0],
        name=row[1],
        tenant=row[2],
        prefix=row[3],
        models=None if models is None else tuple(models),
        max_class=RequestClass(row[5]),
        runners=None if runners is None else tuple(runners),
        allow_external=bool(row[7]),
        limits=Limits.of(limits),
        expires_at=expires_at,
        created_at=created_at,
        revoked_at=revoked_at,
    )


class KeyStore(Protocol):
    """The client-key methods every store backend implements."""

    async def create_key(self, key: ClientKey, digest: str, *, actor: str) -> ClientKey:
        """Store a new key (``key.created_at`` is set from the clock), audited."""
        ...

    async def get_key(self, key_id: str) -> ClientKey | None: ...

    async def key_by_digest(self, digest: str) -> ClientKey | None:
        """The key whose secret has this digest (revoked or not), or None."""
        ...

    async def list_keys(self, *, tenant: str | None = None) -> list[ClientKey]:
        """Every key (of ``tenant``), oldest first."""
        ...

    async def save_key(
        self, key: ClientKey, *, actor: str, action: str, digest: str | None = None
    ) -> ClientKey | None:
        """Replace a key's fields (and its digest, for a rotation), audited as ``action``;
        None when there is no such key."""
        ...

    async def put_bootstrap_key(self, key: ClientKey, digest: str) -> ClientKey:
        """Create or replace a key from the environment (by id), not audited per start."""
        ...

    async def reserve_quota(
        self, key_id: str, limits: Limits, estimate: Estimate, windows: Windows
    ) -> str | None:
        """Reserve ``estimate`` and a concurrency slot, or the code of the limit it breaks
        (nothing taken then)."""
        ...

    async def lease_quota(
        self, key_id: str, limits: Limits, want: Slice, windows: Windows
    ) -> Slice:
        """Take up to ``want`` of the key's minute and day quota for this replica in one
        locked step (:func:`gpugate.core.limits.grant`); what was granted is counted as used."""
        ...

    async def settle_quota(
        self,
        key_id: str,
        windows: Windows,
        estimate: Estimate,
        *,
        tokens: int,
        cents: float,
        requests: int,
    ) -> None:
        """End a reservation: ``tokens``/``cents``/``requests`` replace the estimate (0s give it
        back) and the concurrency slot is freed."""
        ...

    async def purge_counters(self, before: datetime) -> int:
        """Delete minute and day counters last written before ``before``."""
        ...

    async def own(self, kind: str, thing_id: str, tenant: str) -> bool:
        """Record that ``tenant`` owns a job, batch or file; False when it had an owner."""
        ...

    async def disown(self, kind: str, thing_id: str) -> None: ...

    async def purge_orphan_owners(self) -> int:
        """Delete the owner rows whose job, batch or file is gone (purged); how many."""
        ...

    async def owner(self, kind: str, thing_id: str) -> str | None:
        """The tenant that owns it, or None (created in ``open`` mode, or unknown)."""
        ...

    async def add_usage(self, rows: list[UsageRow]) -> None:
        """Add each row's counts to the stored ones of its (day, key, model, upstream)."""
        ...

    async def list_usage(
        self,
        *,
        key_id: str | None = None,
        tenant: str | None = None,
        model: str | None = None,
        since: date | None = None,
        until: date | None = None,
    ) -> list[UsageRow]:
        """Usage rows, oldest day first, every filter given holding (days inclusive)."""
        ...
