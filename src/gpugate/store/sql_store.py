"""The store (:class:`Store`): what gpugate asks of it, written once for both backends.

The config versions and the idempotency keys are here, every other area in its part (audit,
jobs, runtime states, façades, replicas, ledger, retention, keys), each a
:class:`typing.Protocol` that a service types against (the slice it uses, decisions §20).
:class:`SqliteStore` and :class:`PostgresStore` add only a driver: how to connect, migrate and
run a transaction (:mod:`gpugate.store.tx`). The values and the semantics every backend keeps
are in :mod:`gpugate.store.base`.
"""

from __future__ import annotations

from abc import abstractmethod
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from gpugate.errors import StoreError
from gpugate.store.audit import AuditStore, insert_audit
from gpugate.store.base import (
    CONFIG_SAVED,
    CONFIG_SEEDED,
    CONFIG_SUBJECT,
    AuditEvent,
    ConfigVersion,
    IdemBegin,
    IdemRecord,
    InFlight,
    Mismatch,
    Replay,
    Started,
    check_limit,
)
from gpugate.store.dialect import Json, only_postgres, sql
from gpugate.store.facade_base import FacadeStore
from gpugate.store.jobs_sql import JobStore
from gpugate.store.keys import KeyStore
from gpugate.store.ledger import LedgerStore
from gpugate.store.replicas import ReplicaStore
from gpugate.store.retention import RetentionStore
from gpugate.store.runtime_state import RuntimeStateStore
from gpugate.store.tx import count, first, one, read, rows

if TYPE_CHECKING:
    from collections.abc import Sequence

    from gpugate.store.tx import Codec, Tx

_LOCK_CONFIG = only_postgres("LOCK TABLE config_versions IN EXCLUSIVE MODE")
_CONFIG = "version, document, created_at, actor, note"
_CURRENT_CONFIG = sql("SELECT {c} FROM config_versions ORDER BY version DESC LIMIT 1", c=_CONFIG)
_GET_CONFIG = sql("SELECT {c} FROM config_versions WHERE version = :version", c=_CONFIG)
_LIST_CONFIGS = sql("SELECT {c} FROM config_versions ORDER BY version DESC LIMIT :limit", c=_CONFIG)
_SAVE_CONFIG = sql(
    """
INSERT INTO config_versions ({c})
SELECT coalesce(max(version), 0) + 1, :document, :now, :actor, :note FROM config_versions
RETURNING {c}""",
    c=_CONFIG,
)

_IDEM_BEGIN = sql("""
INSERT INTO idempotency AS held (key, fingerprint, state, created_at, expires_at, owner)
VALUES (:key, :fingerprint, 'in_flight', :now, :expires_at, :owner)
ON CONFLICT (key) DO UPDATE SET
    fingerprint = excluded.fingerprint, state = 'in_flight', status = NULL, headers = NULL,
    body = NULL, created_at = excluded.created_at, expires_at = excluded.expires_at,
    owner = excluded.owner
WHERE held.expires_at <= excluded.created_at
RETURNING key""")
_IDEM_HELD = sql("""
SELECT key, fingerprint, state, status, headers, body, created_at, expires_at
FROM idempotency WHERE key = :key""")
_IDEM_COMPLETE = sql("""
UPDATE idempotency
SET state = 'completed', status = :status, headers = :headers, body = :body,
    expires_at = coalesce(:expires_at, expires_at)
WHERE key = :key AND owner = :owner AND state = 'in_flight' AND expires_at > :now""")
_IDEM_ABANDON = sql("""
DELETE FROM idempotency
WHERE key = :key AND owner = :owner AND state = 'in_flight' AND expires_at > :now""")
_IDEM_PURGE = sql("DELETE FROM idempotency WHERE expires_at <= :now")


def _insert_config(
    c: Codec, params: dict[str, Any], action: str, **detail: Any
) -> Tx[ConfigVersion]:
    """The next version, audited as ``action`` (detail: its version and ``detail``)."""
    saved = read(c, ConfigVersion, (yield from one(_SAVE_CONFIG, params)))
    event = AuditEvent(
        params["actor"], action, CONFIG_SUBJECT, {"version": saved.version, **detail}
    )
    yield from insert_audit(c, params["now"], event)
    return saved


def _save_config(c: Codec, params: dict[str, Any]) -> Tx[ConfigVersion]:
    yield from rows(_LOCK_CONFIG)
    return (yield from _insert_config(c, params, CONFIG_SAVED, note=params["note"]))


def _seed_config(c: Codec, params: dict[str, Any]) -> Tx[tuple[ConfigVersion, bool]]:
    yield from rows(_LOCK_CONFIG)
    current = yield from first(_CURRENT_CONFIG)
    if current is not None:
        return read(c, ConfigVersion, current), False
    return (yield from _insert_config(c, params | {"note": "seeded"}, CONFIG_SEEDED)), True


def _idem_begin(c: Codec, params: dict[str, Any]) -> Tx[IdemBegin]:
    if (yield from first(_IDEM_BEGIN, params)) is not None:
        return Started()
    # On PostgreSQL the conflicting row is locked by the upsert above, so it is still there.
    row = yield from first(_IDEM_HELD, params)
    if row is None:
        raise StoreError(f"idempotency key {params['key']!r} vanished inside its transaction")
    return _held(c, row, params["fingerprint"])


def _held(c: Codec, row: Sequence[Any], fingerprint: str) -> InFlight | Replay | Mismatch:
    """What a held key's row (``_IDEM_HELD``'s) says to a request of ``fingerprint``."""
    key, held_by, state, status, headers, body, created_at, expires_at = row
    if held_by != fingerprint:
        return Mismatch()
    if state != "completed":
        return InFlight()
    pairs = tuple((str(name), str(value)) for name, value in c.json(headers))
    times = c.time(created_at), c.time(expires_at)
    return Replay(IdemRecord(key, fingerprint, status, pairs, bytes(body), *times))


class Store(
    JobStore,
    AuditStore,
    RuntimeStateStore,
    FacadeStore,
    ReplicaStore,
    LedgerStore,
    RetentionStore,
    KeyStore,
):
    """The durable state of a gateway: config versions, audit trail, idempotency records, jobs,
    runtime states, the façades' files and batches, the replicas sharing it, the spend ledger,
    the client keys. A backend adds its driver (``_transact``, ``_query``) and these:"""

    backend: str
    """``"sqlite"`` or ``"postgresql"``."""
    _schema: int | None
    """The newest applied migration as last read, None before the first read."""

    def __repr__(self) -> str:
        where, is_open = self._describe()
        schema = "?" if self._schema is None else str(self._schema)
        return f"<{type(self).__name__} {where} schema={schema}{'' if is_open else ' closed'}>"

    @abstractmethod
    def _describe(self) -> tuple[str, bool]:
        """Where the store is, as ``repr`` names it (``path=...``, ``dsn=...`` without a
        password), and whether it is open."""

    @abstractmethod
    async def open(self) -> None:
        """Connect; raises StoreUnavailable (one line, no password) when unreachable."""

    @abstractmethod
    async def close(self) -> None:
        """Release every connection; calling it twice is harmless."""

    @abstractmethod
    async def ping(self) -> None:
        """Raises StoreUnavailable unless the store answers."""

    @abstractmethod
    async def migrate(self) -> list[str]:
        """Apply pending migrations in order; returns the names applied (none when current)."""

    @abstractmethod
    async def schema_version(self) -> int:
        """The newest applied migration, 0 on an empty database."""

    async def current_config(self) -> ConfigVersion | None:
        """The newest config version, None before the first is stored."""
        row = await self._query(first(_CURRENT_CONFIG))
        return None if row is None else read(self._codec, ConfigVersion, row)

    async def get_config(self, version: int) -> ConfigVersion | None:
        """One config version, None when there is no such version."""
        row = await self._query(first(_GET_CONFIG, {"version": version}))
        return None if row is None else read(self._codec, ConfigVersion, row)

    async def list_configs(self, limit: int = 50) -> list[ConfigVersion]:
        """Config versions, newest first."""
        found = await self._query(rows(_LIST_CONFIGS, {"limit": check_limit(limit)}))
        return [read(self._codec, ConfigVersion, row) for row in found]

    async def save_config(
        self, document: dict[str, Any], *, actor: str, note: str
    ) -> ConfigVersion:
        """Store ``document`` as the next version and audit it, in one transaction."""
        params = {"document": Json(document), "now": self._clock.now(), "actor": actor}
        return await self._transact(_save_config(self._codec, params | {"note": note}))

    async def seed_config(
        self, document: dict[str, Any], *, actor: str
    ) -> tuple[ConfigVersion, bool]:
        """Store ``document`` as version 1 unless a version exists; returns (current, seeded)."""
        params = {"document": Json(document), "now": self._clock.now(), "actor": actor}
        return await self._transact(_seed_config(self._codec, params))

    async def idem_begin(
        self, key: str, fingerprint: str, *, ttl_s: float, owner: str
    ) -> IdemBegin:
        """Claim ``key`` for ``owner`` until now + ``ttl_s``, or say what holds it."""
        now = self._clock.now()
        params = {"key": key, "fingerprint": fingerprint, "owner": owner, "now": now}
        params["expires_at"] = now + timedelta(seconds=ttl_s)
        return await self._transact(_idem_begin(self._codec, params))

    async def idem_replay(self, key: str, fingerprint: str) -> Replay | None:
        """The response ``key`` completed with for the request of ``fingerprint``, if one is
        kept and not expired; a read that claims nothing (what :meth:`idem_begin` would
        replay)."""
        row = await self._query(first(_IDEM_HELD, {"key": key}))
        if row is None or self._codec.time(row[7]) <= self._clock.now():
            return None
        held = _held(self._codec, row, fingerprint)
        return held if isinstance(held, Replay) else None

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
        now = self._clock.now()
        expires_at = None if ttl_s is None else now + timedelta(seconds=ttl_s)
        params = {"key": key, "owner": owner, "status": status, "body": body, "now": now}
        params |= {"headers": Json([list(pair) for pair in headers]), "expires_at": expires_at}
        return await self._transact(count(_IDEM_COMPLETE, params), single=True) == 1

    async def idem_abandon(self, key: str, owner: str) -> bool:
        """Drop the owner's in-flight key so a retry can start; False when nothing was dropped."""
        params = {"key": key, "owner": owner, "now": self._clock.now()}
        return await self._transact(count(_IDEM_ABANDON, params), single=True) == 1

    async def idem_purge_expired(self) -> int:
        """Delete every expired idempotency row; returns how many."""
        return await self._transact(count(_IDEM_PURGE, {"now": self._clock.now()}), single=True)
