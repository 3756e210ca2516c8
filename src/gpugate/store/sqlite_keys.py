"""The client-key methods of the SQLite store: a mixin of :class:`gpugate.store.sqlite.SqliteStore`
(see :mod:`gpugate.store.keys`). Every write runs under ``BEGIN IMMEDIATE``, so a reservation's
read-check-add is one step even between two processes on one file."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import date, timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from gpugate.core.limits import Counts, Slice, grant, over_limit
from gpugate.store.base import AuditEvent
from gpugate.store.keys import (
    ALIVE_S,
    CONCURRENCY_SPAN,
    KEY_COLUMNS,
    KEY_CREATED,
    PURGE_ORPHAN_OWNERS,
    USAGE_FILTERS,
    UsageRow,
    audit_detail,
    day_span,
    key_fields,
    key_of,
    minute_span,
    usage_params,
)
from gpugate.store.sqlite_audit import insert_audit
from gpugate.store.sqlite_codec import json_text, text_time, time_text

if TYPE_CHECKING:
    import sqlite3
    from collections.abc import Callable
    from datetime import datetime

    from gpugate.clock import Clock
    from gpugate.core.keys import ClientKey, Limits
    from gpugate.core.limits import Estimate, Windows

T = TypeVar("T")

_SELECT = f"SELECT {KEY_COLUMNS} FROM client_keys"  # noqa: S608 - constants only
_INSERT = """
INSERT INTO client_keys (id, name, tenant, prefix, digest, models, max_class, runners,
    allow_external, limits, expires_at, created_at, updated_at, revoked_at)
VALUES (:id, :name, :tenant, :prefix, :digest, :models, :max_class, :runners,
    :allow_external, :limits, :expires_at, :now, :now, :revoked_at)"""
_UPSERT = (
    _INSERT
    + """
ON CONFLICT (id) DO UPDATE SET name = excluded.name, tenant = excluded.tenant,
    prefix = excluded.prefix, digest = excluded.digest, models = excluded.models,
    max_class = excluded.max_class, runners = excluded.runners,
    allow_external = excluded.allow_external, limits = excluded.limits,
    expires_at = excluded.expires_at, updated_at = excluded.updated_at, revoked_at = NULL"""
)
_UPDATE = """
UPDATE client_keys SET name = :name, tenant = :tenant, models = :models, max_class = :max_class,
    runners = :runners, allow_external = :allow_external, limits = :limits,
    expires_at = :expires_at, revoked_at = :revoked_at, updated_at = :now,
    prefix = coalesce(:prefix, prefix), digest = coalesce(:digest, digest)
WHERE id = :id"""
_COUNTS = """
SELECT span, requests, tokens, cents FROM key_counters
WHERE key_id = :key AND span IN (:minute, :day)"""
_INFLIGHT = """
SELECT coalesce(sum(requests), 0) FROM key_counters
WHERE key_id = :key AND span LIKE 'c:%' AND (substr(span, 3) = :me OR substr(span, 3) IN (
    SELECT id FROM gateway_replicas WHERE last_seen >= :alive))"""
_ADD = """
INSERT INTO key_counters (key_id, span, requests, tokens, cents, at)
VALUES (:key, :span, :requests, :tokens, :cents, :now)
ON CONFLICT (key_id, span) DO UPDATE SET requests = max(0, requests + excluded.requests),
    tokens = max(0, tokens + excluded.tokens), cents = max(0, cents + excluded.cents),
    at = excluded.at"""
_OWN = "INSERT INTO tenancy (kind, id, tenant) VALUES (?, ?, ?) ON CONFLICT DO NOTHING"
_DISOWN = "DELETE FROM tenancy WHERE kind = ? AND id = ?"
_OWNER = "SELECT tenant FROM tenancy WHERE kind = ? AND id = ?"
_PURGE = "DELETE FROM key_counters WHERE span NOT LIKE 'c:%' AND at < :before"
_USAGE_ADD = """
INSERT INTO key_usage (day, key_id, tenant, model, upstream, requests, prompt_tokens,
    completion_tokens, cents)
VALUES (:day, :key_id, :tenant, :model, :upstream, :requests, :prompt, :completion, :cents)
ON CONFLICT (day, key_id, model, upstream) DO UPDATE SET
    requests = requests + excluded.requests, prompt_tokens = prompt_tokens + excluded.prompt_tokens,
    completion_tokens = completion_tokens + excluded.completion_tokens,
    cents = cents + excluded.cents"""


def _key(row: tuple[Any, ...]) -> ClientKey:
    def loads(text: str | None) -> Any:
        return None if text is None else json.loads(text)

    def when(text: str | None) -> datetime | None:
        return None if text is None else text_time(text)

    return key_of(
        row,
        models=loads(row[4]),
        runners=loads(row[6]),
        limits=loads(row[8]),
        times=(when(row[9]), when(row[10]), when(row[11])),
    )


def _params(key: ClientKey) -> dict[str, Any]:
    params = key_fields(key)
    params["allow_external"] = int(key.allow_external)
    params["models"] = None if key.models is None else json_text(list(key.models))
    params["runners"] = None if key.runners is None else json_text(list(key.runners))
    params["limits"] = json_text(key.limits.as_dict())
    params["expires_at"] = None if key.expires_at is None else time_text(key.expires_at)
    params["revoked_at"] = None if key.revoked_at is None else time_text(key.revoked_at)
    return params


class SqliteKeys:
    """The :class:`gpugate.store.keys.KeyStore` methods of the SQLite store."""

    _clock: Clock
    _replica: str

    if TYPE_CHECKING:

        async def _read(self, work: Callable[[sqlite3.Connection], T]) -> T: ...

        async def _write(self, work: Callable[[sqlite3.Connection], T]) -> T: ...

    async def create_key(self, key: ClientKey, digest: str, *, actor: str) -> ClientKey:
        now = self._clock.now()
        stored = replace(key, created_at=now)
        params = _params(stored) | {"digest": digest, "now": time_text(now)}
        event = AuditEvent(actor, KEY_CREATED, f"key:{key.id}", audit_detail(stored))

        def work(conn: sqlite3.Connection) -> ClientKey:
            conn.execute(_INSERT, params)
            insert_audit(conn, time_text(now), event)
            return stored

        return await self._write(work)

    async def get_key(self, key_id: str) -> ClientKey | None:
        row = await self._read(
            lambda conn: conn.execute(_SELECT + " WHERE id = ?", (key_id,)).fetchone()
        )
        return None if row is None else _key(row)

    async def key_by_digest(self, digest: str) -> ClientKey | None:
        row = await self._read(
            lambda conn: conn.execute(_SELECT + " WHERE digest = ?", (digest,)).fetchone()
        )
        return None if row is None else _key(row)

    async def list_keys(self, *, tenant: str | None = None) -> list[ClientKey]:
        args: tuple[str, ...] = ()
        if tenant is None:
            sql = _SELECT + " ORDER BY created_at, id"
        else:
            sql, args = _SELECT + " WHERE tenant = ? ORDER BY created_at, id", (tenant,)
        rows = await self._read(lambda conn: conn.execute(sql, args).fetchall())
        return [_key(row) for row in rows]

    async def save_key(
        self, key: ClientKey, *, actor: str, action: str, digest: str | None = None
    ) -> ClientKey | None:
        now = self._clock.now()
        params = _params(key) | {"now": time_text(now), "digest": digest}
        params["prefix"] = key.prefix if digest is not None else None
        event = AuditEvent(actor, action, f"key:{key.id}", audit_detail(key))

        def work(conn: sqlite3.Connection) -> ClientKey | None:
            if conn.execute(_UPDATE, params).rowcount != 1:
                return None
            insert_audit(conn, time_text(now), event)
            row = conn.execute(_SELECT + " WHERE id = ?", (key.id,)).fetchone()
            return _key(row)

        return await self._write(work)

    async def put_bootstrap_key(self, key: ClientKey, digest: str) -> ClientKey:
        now = self._clock.now()
        params = _params(key) | {"digest": digest, "now": time_text(now)}

        def work(conn: sqlite3.Connection) -> ClientKey:
            conn.execute(_UPSERT, params)
            return _key(conn.execute(_SELECT + " WHERE id = ?", (key.id,)).fetchone())

        return await self._write(work)

    async def reserve_quota(
        self, key_id: str, limits: Limits, estimate: Estimate, windows: Windows
    ) -> str | None:
        now = self._clock.now()
        minute, day = minute_span(windows), day_span(windows)
        alive = time_text(now - timedelta(seconds=ALIVE_S))
        found = {"key": key_id, "minute": minute, "day": day, "me": self._replica, "alive": alive}

        def work(conn: sqlite3.Connection) -> str | None:
            rows = {r[0]: r for r in conn.execute(_COUNTS, found).fetchall()}
            inflight = conn.execute(_INFLIGHT, found).fetchone()[0]
            m, d = rows.get(minute), rows.get(day)
            counts = Counts(
                minute_requests=m[1] if m else 0,
                minute_tokens=m[2] if m else 0,
                day_tokens=d[2] if d else 0,
                day_cents=d[3] if d else 0.0,
                inflight=inflight,
            )
            code = over_limit(limits, counts, estimate)
            if code is not None:
                return code
            at = time_text(now)
            adds = [
                (minute, 1, estimate.tokens, estimate.cents),
                (day, 1, estimate.tokens, estimate.cents),
                (f"{CONCURRENCY_SPAN}:{self._replica}", 1, 0, 0.0),
            ]
            for span, requests, tokens, cents in adds:
                conn.execute(
                    _ADD,
                    {"key": key_id, "span": span, "requests": requests, "tokens": tokens}
                    | {"cents": cents, "now": at},
                )
            return None

        return await self._write(work)

    async def lease_quota(
        self, key_id: str, limits: Limits, want: Slice, windows: Windows
    ) -> Slice:
        now = self._clock.now()
        minute, day = minute_span(windows), day_span(windows)
        found = {"key": key_id, "minute": minute, "day": day}

        def work(conn: sqlite3.Connection) -> Slice:
            rows = {r[0]: r for r in conn.execute(_COUNTS, found).fetchall()}
            m, d = rows.get(minute), rows.get(day)
            counts = Counts(
                minute_requests=m[1] if m else 0,
                minute_tokens=m[2] if m else 0,
                day_tokens=d[2] if d else 0,
                day_cents=d[3] if d else 0.0,
            )
            got = grant(limits, counts, want)
            at = time_text(now)
            for span, requests, tokens, cents in (
                (minute, got.requests or 0, got.tokens or 0, 0.0),
                (day, 0, got.day_tokens or 0, got.day_cents or 0.0),
            ):
                conn.execute(
                    _ADD,
                    {"key": key_id, "span": span, "requests": requests, "tokens": tokens}
                    | {"cents": cents, "now": at},
                )
            return got

        return await self._write(work)

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
        at = time_text(self._clock.now())
        adds = [
            (minute_span(windows), requests - 1, tokens - estimate.tokens, cents - estimate.cents),
            (day_span(windows), requests - 1, tokens - estimate.tokens, cents - estimate.cents),
            (f"{CONCURRENCY_SPAN}:{self._replica}", -1, 0, 0.0),
        ]

        def work(conn: sqlite3.Connection) -> None:
            for span, n, t, c in adds:
                conn.execute(
                    _ADD,
                    {"key": key_id, "span": span, "requests": n, "tokens": t}
                    | {"cents": c, "now": at},
                )

        await self._write(work)

    async def purge_counters(self, before: datetime) -> int:
        params = {"before": time_text(before)}
        return await self._write(lambda conn: conn.execute(_PURGE, params).rowcount)

    async def own(self, kind: str, thing_id: str, tenant: str) -> bool:
        params = (kind, thing_id, tenant)
        return await self._write(lambda conn: conn.execute(_OWN, params).rowcount == 1)

    async def disown(self, kind: str, thing_id: str) -> None:
        await self._write(lambda conn: conn.execute(_DISOWN, (kind, thing_id)))

    async def purge_orphan_owners(self) -> int:
        def work(conn: sqlite3.Connection) -> int:
            return sum(conn.execute(sql).rowcount for sql in PURGE_ORPHAN_OWNERS)

        return await self._write(work)

    async def owner(self, kind: str, thing_id: str) -> str | None:
        row = await self._read(lambda conn: conn.execute(_OWNER, (kind, thing_id)).fetchone())
        return None if row is None else str(row[0])

    async def add_usage(self, rows: list[UsageRow]) -> None:
        params = [usage_params(r) | {"day": r.day.isoformat()} for r in rows]
        if params:
            await self._write(lambda conn: conn.executemany(_USAGE_ADD, params))

    async def list_usage(
        self,
        *,
        key_id: str | None = None,
        tenant: str | None = None,
        model: str | None = None,
        since: date | None = None,
        until: date | None = None,
    ) -> list[UsageRow]:
        given: dict[str, Any] = {"key_id": key_id, "tenant": tenant, "model": model}
        given |= {"since": since and since.isoformat(), "until": until and until.isoformat()}
        where = [f"{test} :{name}" for name, test in USAGE_FILTERS if given[name] is not None]
        sql = (
            "SELECT day, key_id, tenant, model, upstream, requests, prompt_tokens, "  # noqa: S608 - constants; values bound
            "completion_tokens, cents FROM key_usage"
            + (" WHERE " + " AND ".join(where) if where else "")
            + " ORDER BY day, key_id, model, upstream"
        )
        rows = await self._read(lambda conn: conn.execute(sql, given).fetchall())
        return [UsageRow(date.fromisoformat(r[0]), *r[1:]) for r in rows]
