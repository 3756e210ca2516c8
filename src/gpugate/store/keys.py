"""Client keys, their limit counters and their usage in the store (issue #16), once for both
backends.

Semantics every backend keeps:

* A key is stored with the SHA-256 of its secret (``digest``, unique), never the secret. A
  create, update, rotation or revocation and its audit event commit together.
* :meth:`KeyStore.lease_quota` is one decision across replicas: it locks the key's row first
  (PostgreSQL: ``SELECT ... FOR UPDATE``; SQLite: ``BEGIN IMMEDIATE`` holds the one write lock),
  reads its counters (the minute's, the day's, and the concurrency slots every live replica
  holds), grants what is left of each limit up to what was asked
  (:func:`gpugate.core.limits.grant`) and counts it, in one transaction; so leases of one key
  from every replica serialise, each reads the totals the previous one committed, and two
  never both take the last unit. Slots stay counted for the replica until
  :meth:`KeyStore.return_slots`, or until it has been silent for :data:`ALIVE_S`.
* Usage rows add up per (day, key, model, upstream).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import date, datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol

from gpugate.core.classes import RequestClass
from gpugate.core.keys import ClientKey, Limits
from gpugate.core.limits import Counts, Slice, Windows, grant
from gpugate.store.audit import insert_audit
from gpugate.store.base import AuditEvent
from gpugate.store.dialect import Json, sql
from gpugate.store.tx import Driven, count, first, one, read, rows, run, values

if TYPE_CHECKING:
    from gpugate.store.tx import Codec, Row, Tx

KEY_CREATED = "key.created"
KEY_UPDATED = "key.updated"
KEY_ROTATED = "key.rotated"
KEY_REVOKED = "key.revoked"
KEY_LIMITED = "key.limited"
CONCURRENCY_SPAN = "c"

ALIVE_S = 30.0
"""A replica heard of within this long still holds its concurrency slots (a dead one's go)."""


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


_KEY = (
    "id, name, tenant, prefix, models, max_class, runners, allow_external, limits, expires_at,"
    " created_at, revoked_at"
)
_BY_ID = sql("SELECT {key} FROM client_keys WHERE id = :id", key=_KEY)
_BY_DIGEST = sql("SELECT {key} FROM client_keys WHERE digest = :digest", key=_KEY)
_LIST = sql(
    "SELECT {key} FROM client_keys"
    " WHERE (:tenant::text IS NULL OR tenant = :tenant) ORDER BY created_at, id",
    key=_KEY,
)
_INSERT = """
INSERT INTO client_keys AS held (id, name, tenant, prefix, digest, models, max_class, runners,
    allow_external, limits, expires_at, created_at, updated_at, revoked_at)
VALUES (:id, :name, :tenant, :prefix, :digest, :models, :max_class, :runners,
    :allow_external, :limits, :expires_at, :now, :now, :revoked_at)"""
_CREATE = sql(_INSERT)
_UPSERT = sql(
    _INSERT
    + """
ON CONFLICT (id) DO UPDATE SET name = excluded.name, tenant = excluded.tenant,
    prefix = excluded.prefix, digest = excluded.digest, models = excluded.models,
    max_class = excluded.max_class, runners = excluded.runners,
    allow_external = excluded.allow_external, limits = excluded.limits,
    expires_at = excluded.expires_at, updated_at = excluded.updated_at,
    revoked_at = CASE WHEN held.digest = excluded.digest THEN held.revoked_at END"""
)  # a revoked bootstrap key stays revoked until the environment gives it another secret
_UPDATE = sql("""
UPDATE client_keys SET name = :name, tenant = :tenant, models = :models,
    max_class = :max_class, runners = :runners, allow_external = :allow_external,
    limits = :limits, expires_at = :expires_at, revoked_at = :revoked_at, updated_at = :now,
    prefix = coalesce(:prefix, prefix), digest = coalesce(:digest, digest)
WHERE id = :id""")
_LOCK = sql("SELECT 1 FROM client_keys WHERE id = :key FOR UPDATE")
_COUNTS = sql("""
SELECT
  (SELECT requests FROM key_counters WHERE key_id = :key AND span = :minute),
  (SELECT tokens FROM key_counters WHERE key_id = :key AND span = :minute),
  (SELECT tokens FROM key_counters WHERE key_id = :key AND span = :day),
  (SELECT cents FROM key_counters WHERE key_id = :key AND span = :day),
  (SELECT coalesce(sum(requests), 0) FROM key_counters
   WHERE key_id = :key AND span LIKE 'c:%' AND (substr(span, 3) = :me
     OR substr(span, 3) IN (SELECT id FROM gateway_replicas WHERE last_seen >= :alive)))""")
_ADD = sql("""
INSERT INTO key_counters AS c (key_id, span, requests, tokens, cents, at)
VALUES (:key, :span, :requests, :tokens, :cents, :now)
ON CONFLICT (key_id, span) DO UPDATE SET
    requests = greatest(0, c.requests + excluded.requests),
    tokens = greatest(0, c.tokens + excluded.tokens),
    cents = greatest(0, c.cents + excluded.cents), at = excluded.at""")
_OWN = sql(
    "INSERT INTO tenancy (kind, id, tenant) VALUES (:kind, :id, :tenant) ON CONFLICT DO NOTHING"
)
_DISOWN = sql("DELETE FROM tenancy WHERE kind = :kind AND id = :id")
_OWNER = sql("SELECT tenant FROM tenancy WHERE kind = :kind AND id = :id")
# The owner rows of things no longer stored (a job's row is written before the job: its
# creator writes it again after, so a purge in between loses nothing).
_PURGE_OWNERS = (
    sql("DELETE FROM tenancy WHERE kind = 'job' AND id NOT IN (SELECT slug FROM jobs)"),
    sql("DELETE FROM tenancy WHERE kind = 'batch' AND id NOT IN (SELECT id FROM batches)"),
    sql("DELETE FROM tenancy WHERE kind = 'file' AND id NOT IN (SELECT id FROM batch_files)"),
)
_PURGE = sql("DELETE FROM key_counters WHERE span NOT LIKE 'c:%' AND at < :before")
_USAGE_ADD = sql("""
INSERT INTO key_usage AS u (day, key_id, tenant, model, upstream, requests, prompt_tokens,
    completion_tokens, cents)
VALUES (:day, :key_id, :tenant, :model, :upstream, :requests, :prompt_tokens,
    :completion_tokens, :cents)
ON CONFLICT (day, key_id, model, upstream) DO UPDATE SET
    requests = u.requests + excluded.requests,
    prompt_tokens = u.prompt_tokens + excluded.prompt_tokens,
    completion_tokens = u.completion_tokens + excluded.completion_tokens,
    cents = u.cents + excluded.cents""")
_USAGE = sql("""
SELECT day, key_id, tenant, model, upstream, requests, prompt_tokens, completion_tokens, cents
FROM key_usage
WHERE (:key_id::text IS NULL OR key_id = :key_id) AND (:tenant::text IS NULL OR tenant = :tenant)
  AND (:model::text IS NULL OR model = :model) AND (:since::date IS NULL OR day >= :since)
  AND (:until::date IS NULL OR day <= :until)
ORDER BY day, key_id, model, upstream""")


def _listed(c: Codec, value: Any) -> tuple[str, ...]:
    return tuple(c.json(value))


_KEY_READERS: dict[str, Any] = {"models": _listed, "runners": _listed}
_KEY_READERS["max_class"] = lambda _, value: RequestClass(value)
_KEY_READERS["limits"] = lambda c, value: Limits.of(c.json(value))


def _key(c: Codec, row: Row) -> ClientKey:
    return read(c, ClientKey, row, **_KEY_READERS)


def _params(key: ClientKey) -> dict[str, Any]:
    """A key's stored columns as parameters (its digest and the time are the caller's)."""
    params = values(key)
    for name in ("models", "runners"):
        params[name] = None if params[name] is None else Json(list(params[name]))
    return params | {"max_class": key.max_class.value, "limits": Json(key.limits.as_dict())}


def _counts(row: Row) -> Counts:
    return Counts(
        minute_requests=row[0] or 0,
        minute_tokens=row[1] or 0,
        day_tokens=row[2] or 0,
        day_cents=row[3] or 0.0,
        inflight=row[4],
    )


def _adds(key_id: str, now: datetime, *spans: tuple[str, int, int, float]) -> list[dict[str, Any]]:
    return [
        {"key": key_id, "span": span, "requests": n, "tokens": t, "cents": c, "now": now}
        for span, n, t, c in spans
    ]


def _create(c: Codec, params: dict[str, Any], event: AuditEvent) -> Tx[None]:
    yield from run(_CREATE, params)
    yield from insert_audit(c, params["now"], event)


def _save(c: Codec, params: dict[str, Any], event: AuditEvent) -> Tx[ClientKey | None]:
    if (yield from count(_UPDATE, params)) != 1:
        return None
    yield from insert_audit(c, params["now"], event)
    return _key(c, (yield from one(_BY_ID, params)))


def _bootstrap(c: Codec, params: dict[str, Any]) -> Tx[ClientKey]:
    yield from run(_UPSERT, params)
    return _key(c, (yield from one(_BY_ID, params)))


def _lease(found: dict[str, Any], limits: Limits, want: Slice, now: datetime) -> Tx[Slice]:
    yield from run(_LOCK, found)
    got = grant(limits, _counts((yield from one(_COUNTS, found))), want)
    minute = (found["minute"], got.requests or 0, got.tokens or 0, 0.0)
    day = (found["day"], 0, got.day_tokens or 0, got.day_cents or 0.0)
    spans = [minute, day]
    if got.slots:  # held by this replica until it gives them back (or is silent ALIVE_S)
        spans.append((f"{CONCURRENCY_SPAN}:{found['me']}", got.slots, 0, 0.0))
    yield from run(_ADD, _adds(found["key"], now, *spans))
    return got


def _purge_owners() -> Tx[int]:
    purged = 0
    for statement in _PURGE_OWNERS:
        purged += yield from count(statement)
    return purged


class KeyStore(Driven, Protocol):
    """The client-key methods of :class:`gpugate.store.Store`."""

    async def create_key(self, key: ClientKey, digest: str, *, actor: str) -> ClientKey:
        """Store a new key (``key.created_at`` is set from the clock), audited."""
        now = self._clock.now()
        stored = replace(key, created_at=now)
        params = _params(stored) | {"digest": digest, "now": now}
        event = AuditEvent(actor, KEY_CREATED, f"key:{key.id}", audit_detail(stored))
        await self._transact(_create(self._codec, params, event))
        return stored

    async def get_key(self, key_id: str) -> ClientKey | None:
        row = await self._query(first(_BY_ID, {"id": key_id}))
        return None if row is None else _key(self._codec, row)

    async def key_by_digest(self, digest: str) -> ClientKey | None:
        """The key whose secret has this digest (revoked or not), or None."""
        row = await self._query(first(_BY_DIGEST, {"digest": digest}))
        return None if row is None else _key(self._codec, row)

    async def list_keys(self, *, tenant: str | None = None) -> list[ClientKey]:
        """Every key (of ``tenant``), oldest first."""
        return [_key(self._codec, r) for r in await self._query(rows(_LIST, {"tenant": tenant}))]

    async def save_key(
        self, key: ClientKey, *, actor: str, action: str, digest: str | None = None
    ) -> ClientKey | None:
        """Replace a key's fields (and its digest, for a rotation), audited as ``action``;
        None when there is no such key."""
        params = _params(key) | {"now": self._clock.now(), "digest": digest}
        params["prefix"] = key.prefix if digest is not None else None
        event = AuditEvent(actor, action, f"key:{key.id}", audit_detail(key))
        return await self._transact(_save(self._codec, params, event))

    async def put_bootstrap_key(self, key: ClientKey, digest: str) -> ClientKey:
        """Create or replace a key from the environment (by id), not audited per start; a
        revocation holds as long as the environment offers the same secret."""
        params = _params(key) | {"digest": digest, "now": self._clock.now()}
        return await self._transact(_bootstrap(self._codec, params))

    async def lease_quota(
        self, key_id: str, limits: Limits, want: Slice, windows: Windows
    ) -> Slice:
        """Take up to ``want`` of the key's minute and day quota and concurrency slots for this
        replica in one locked step (:func:`gpugate.core.limits.grant`: the slots of every live
        replica count); what was granted is counted as used, the slots as held by this replica
        until :meth:`return_slots`."""
        now = self._clock.now()
        found: dict[str, Any] = {"key": key_id, "minute": minute_span(windows)}
        found["day"] = day_span(windows)
        found |= {"me": self._replica, "alive": now - timedelta(seconds=ALIVE_S)}
        return await self._transact(_lease(found, limits, want, now))

    async def return_slots(self, key_id: str, slots: int) -> None:
        """Give back concurrency slots this replica leased (:meth:`lease_quota`)."""
        adds = _adds(
            key_id, self._clock.now(), (f"{CONCURRENCY_SPAN}:{self._replica}", -slots, 0, 0.0)
        )
        await self._transact(run(_ADD, adds), single=True)

    async def purge_counters(self, before: datetime) -> int:
        """Delete minute and day counters last written before ``before``."""
        return await self._transact(count(_PURGE, {"before": before}), single=True)

    async def own(self, kind: str, thing_id: str, tenant: str) -> bool:
        """Record that ``tenant`` owns a job, batch or file; False when it had an owner."""
        params = {"kind": kind, "id": thing_id, "tenant": tenant}
        return await self._transact(count(_OWN, params), single=True) == 1

    async def disown(self, kind: str, thing_id: str) -> None:
        await self._transact(run(_DISOWN, {"kind": kind, "id": thing_id}), single=True)

    async def purge_orphan_owners(self) -> int:
        """Delete the owner rows whose job, batch or file is gone (purged); how many."""
        return await self._transact(_purge_owners())

    async def owner(self, kind: str, thing_id: str) -> str | None:
        """The tenant that owns it, or None (created in ``open`` mode, or unknown)."""
        row = await self._query(first(_OWNER, {"kind": kind, "id": thing_id}))
        return None if row is None else str(row[0])

    async def add_usage(self, rows: list[UsageRow]) -> None:
        """Add each row's counts to the stored ones of its (day, key, model, upstream)."""
        if rows:
            await self._transact(run(_USAGE_ADD, [values(row) for row in rows]))

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
        given: dict[str, Any] = {"key_id": key_id, "tenant": tenant, "model": model}
        given["since"] = since
        found = await self._query(rows(_USAGE, given | {"until": until}))
        return [read(self._codec, UsageRow, row) for row in found]
