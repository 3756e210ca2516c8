"""The client-key methods of the PostgreSQL store: a mixin of
:class:`gpugate.store.postgres.PostgresStore` (see :mod:`gpugate.store.keys`).

A reservation locks the key's row (``SELECT ... FOR UPDATE``) before it reads the counters, so
reservations of one key from every replica serialise on that lock and each reads the totals the
previous one committed (under READ COMMITTED each statement sees what committed before it began).
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, date, datetime, timedelta
from typing import TYPE_CHECKING, Any

from psycopg.types.json import Jsonb

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
from gpugate.store.postgres_audit import insert_audit

if TYPE_CHECKING:
    from contextlib import AbstractAsyncContextManager

    import psycopg
    from psycopg.rows import TupleRow

    from gpugate.clock import Clock
    from gpugate.core.keys import ClientKey, Limits
    from gpugate.core.limits import Estimate, Windows

    Connection = psycopg.AsyncConnection[TupleRow]

_SELECT = f"SELECT {KEY_COLUMNS} FROM client_keys"  # noqa: S608 - constants only
_INSERT = """
INSERT INTO client_keys AS held (id, name, tenant, prefix, digest, models, max_class, runners,
    allow_external, limits, expires_at, created_at, updated_at, revoked_at)
VALUES (%(id)s, %(name)s, %(tenant)s, %(prefix)s, %(digest)s, %(models)s, %(max_class)s,
    %(runners)s, %(allow_external)s, %(limits)s, %(expires_at)s, %(now)s, %(now)s,
    %(revoked_at)s)"""
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
UPDATE client_keys SET name = %(name)s, tenant = %(tenant)s, models = %(models)s,
    max_class = %(max_class)s, runners = %(runners)s, allow_external = %(allow_external)s,
    limits = %(limits)s, expires_at = %(expires_at)s, revoked_at = %(revoked_at)s,
    updated_at = %(now)s, prefix = coalesce(%(prefix)s, prefix),
    digest = coalesce(%(digest)s, digest)
WHERE id = %(id)s"""
_LOCK = "SELECT 1 FROM client_keys WHERE id = %(key)s FOR UPDATE"
_COUNTS = """
SELECT
  (SELECT requests FROM key_counters WHERE key_id = %(key)s AND span = %(minute)s),
  (SELECT tokens FROM key_counters WHERE key_id = %(key)s AND span = %(minute)s),
  (SELECT tokens FROM key_counters WHERE key_id = %(key)s AND span = %(day)s),
  (SELECT cents FROM key_counters WHERE key_id = %(key)s AND span = %(day)s),
  (SELECT coalesce(sum(requests), 0) FROM key_counters
   WHERE key_id = %(key)s AND span LIKE 'c:%%' AND (substr(span, 3) = %(me)s
     OR substr(span, 3) IN (SELECT id FROM gateway_replicas WHERE last_seen >= %(alive)s)))"""
_ADD = """
INSERT INTO key_counters AS c (key_id, span, requests, tokens, cents, at)
SELECT %(key)s, span, requests, tokens, cents, %(now)s
FROM unnest(%(spans)s::text[], %(requests)s::bigint[], %(tokens)s::bigint[],
            %(cents)s::double precision[]) AS t(span, requests, tokens, cents)
ON CONFLICT (key_id, span) DO UPDATE SET
    requests = greatest(0, c.requests + excluded.requests),
    tokens = greatest(0, c.tokens + excluded.tokens),
    cents = greatest(0, c.cents + excluded.cents), at = excluded.at"""
_OWN = "INSERT INTO tenancy (kind, id, tenant) VALUES (%s, %s, %s) ON CONFLICT DO NOTHING"
_DISOWN = "DELETE FROM tenancy WHERE kind = %s AND id = %s"
_OWNER = "SELECT tenant FROM tenancy WHERE kind = %s AND id = %s"
_PURGE = "DELETE FROM key_counters WHERE span NOT LIKE 'c:%%' AND at < %(before)s"
_USAGE_ADD = """
INSERT INTO key_usage AS u (day, key_id, tenant, model, upstream, requests, prompt_tokens,
    completion_tokens, cents)
VALUES (%(day)s, %(key_id)s, %(tenant)s, %(model)s, %(upstream)s, %(requests)s, %(prompt)s,
    %(completion)s, %(cents)s)
ON CONFLICT (day, key_id, model, upstream) DO UPDATE SET
    requests = u.requests + excluded.requests,
    prompt_tokens = u.prompt_tokens + excluded.prompt_tokens,
    completion_tokens = u.completion_tokens + excluded.completion_tokens,
    cents = u.cents + excluded.cents"""


def _utc(moment: datetime | None) -> datetime | None:
    return None if moment is None else moment.astimezone(UTC)


def _key(row: TupleRow) -> ClientKey:
    return key_of(
        row,
        models=row[4],
        runners=row[6],
        limits=row[8],
        times=(_utc(row[9]), _utc(row[10]), _utc(row[11])),
    )


def _params(key: ClientKey) -> dict[str, Any]:
    params = key_fields(key)
    params["models"] = None if key.models is None else Jsonb(list(key.models))
    params["runners"] = None if key.runners is None else Jsonb(list(key.runners))
    params["limits"] = Jsonb(key.limits.as_dict())
    params["expires_at"] = key.expires_at
    params["revoked_at"] = key.revoked_at
    return params


class PostgresKeys:
    """The :class:`gpugate.store.keys.KeyStore` methods of PostgreSQL."""

    _clock: Clock
    _replica: str

    if TYPE_CHECKING:

        def _transaction(
            self, *, single: bool = False
        ) -> AbstractAsyncContextManager[Connection]: ...

    async def create_key(self, key: ClientKey, digest: str, *, actor: str) -> ClientKey:
        now = self._clock.now()
        stored = replace(key, created_at=now)
        params = _params(stored) | {"digest": digest, "now": now}
        async with self._transaction() as conn:
            await conn.execute(_INSERT, params)
            event = AuditEvent(actor, KEY_CREATED, f"key:{key.id}", audit_detail(stored))
            await insert_audit(conn, now, event)
        return stored

    async def _one_key(self, where: str, value: str) -> ClientKey | None:
        async with self._transaction(single=True) as conn:
            sql = f"{_SELECT} WHERE {where} = %s"
            row = await (await conn.execute(sql, (value,))).fetchone()
        return None if row is None else _key(row)

    async def get_key(self, key_id: str) -> ClientKey | None:
        return await self._one_key("id", key_id)

    async def key_by_digest(self, digest: str) -> ClientKey | None:
        return await self._one_key("digest", digest)

    async def list_keys(self, *, tenant: str | None = None) -> list[ClientKey]:
        async with self._transaction(single=True) as conn:
            if tenant is None:
                cur = await conn.execute(_SELECT + " ORDER BY created_at, id")
            else:
                cur = await conn.execute(
                    _SELECT + " WHERE tenant = %s ORDER BY created_at, id", (tenant,)
                )
            rows = await cur.fetchall()
        return [_key(row) for row in rows]

    async def save_key(
        self, key: ClientKey, *, actor: str, action: str, digest: str | None = None
    ) -> ClientKey | None:
        now = self._clock.now()
        params = _params(key) | {"now": now, "digest": digest}
        params["prefix"] = key.prefix if digest is not None else None
        async with self._transaction() as conn:
            if (await conn.execute(_UPDATE, params)).rowcount != 1:
                return None
            await insert_audit(
                conn, now, AuditEvent(actor, action, f"key:{key.id}", audit_detail(key))
            )
            row = await (await conn.execute(_SELECT + " WHERE id = %s", (key.id,))).fetchone()
        assert row is not None
        return _key(row)

    async def put_bootstrap_key(self, key: ClientKey, digest: str) -> ClientKey:
        params = _params(key) | {"digest": digest, "now": self._clock.now()}
        async with self._transaction() as conn:
            await conn.execute(_UPSERT, params)
            row = await (await conn.execute(_SELECT + " WHERE id = %s", (key.id,))).fetchone()
        assert row is not None
        return _key(row)

    async def reserve_quota(
        self, key_id: str, limits: Limits, estimate: Estimate, windows: Windows
    ) -> str | None:
        now = self._clock.now()
        minute, day = minute_span(windows), day_span(windows)
        found: dict[str, Any] = {"key": key_id, "minute": minute, "day": day}
        found |= {"me": self._replica, "alive": now - timedelta(seconds=ALIVE_S)}
        async with self._transaction() as conn:
            await conn.execute(_LOCK, found)
            row = await (await conn.execute(_COUNTS, found)).fetchone()
            assert row is not None
            counts = Counts(
                minute_requests=row[0] or 0,
                minute_tokens=row[1] or 0,
                day_tokens=row[2] or 0,
                day_cents=row[3] or 0.0,
                inflight=row[4],
            )
            code = over_limit(limits, counts, estimate)
            if code is not None:
                return code
            await conn.execute(
                _ADD,
                {
                    "key": key_id,
                    "now": now,
                    "spans": [minute, day, f"{CONCURRENCY_SPAN}:{self._replica}"],
                    "requests": [1, 1, 1],
                    "tokens": [estimate.tokens, estimate.tokens, 0],
                    "cents": [estimate.cents, estimate.cents, 0.0],
                },
            )
        return None

    async def lease_quota(
        self, key_id: str, limits: Limits, want: Slice, windows: Windows
    ) -> Slice:
        now = self._clock.now()
        minute, day = minute_span(windows), day_span(windows)
        found: dict[str, Any] = {"key": key_id, "minute": minute, "day": day}
        found |= {"me": self._replica, "alive": now}
        async with self._transaction() as conn:
            await conn.execute(_LOCK, found)
            row = await (await conn.execute(_COUNTS, found)).fetchone()
            assert row is not None
            counts = Counts(
                minute_requests=row[0] or 0,
                minute_tokens=row[1] or 0,
                day_tokens=row[2] or 0,
                day_cents=row[3] or 0.0,
            )
            got = grant(limits, counts, want)
            await conn.execute(
                _ADD,
                {
                    "key": key_id,
                    "now": now,
                    "spans": [minute, day],
                    "requests": [got.requests or 0, 0],
                    "tokens": [got.tokens or 0, got.day_tokens or 0],
                    "cents": [0.0, got.day_cents or 0.0],
                },
            )
        return got

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
        dt, dc = tokens - estimate.tokens, cents - estimate.cents
        params = {
            "key": key_id,
            "now": self._clock.now(),
            "spans": [minute_span(windows), day_span(windows), f"c:{self._replica}"],
            "requests": [requests - 1, requests - 1, -1],
            "tokens": [dt, dt, 0],
            "cents": [dc, dc, 0.0],
        }
        async with self._transaction(single=True) as conn:
            await conn.execute(_ADD, params)

    async def purge_counters(self, before: datetime) -> int:
        async with self._transaction(single=True) as conn:
            return (await conn.execute(_PURGE, {"before": before})).rowcount

    async def own(self, kind: str, thing_id: str, tenant: str) -> bool:
        async with self._transaction(single=True) as conn:
            return (await conn.execute(_OWN, (kind, thing_id, tenant))).rowcount == 1

    async def disown(self, kind: str, thing_id: str) -> None:
        async with self._transaction(single=True) as conn:
            await conn.execute(_DISOWN, (kind, thing_id))

    async def purge_orphan_owners(self) -> int:
        async with self._transaction() as conn:
            return sum([(await conn.execute(sql)).rowcount for sql in PURGE_ORPHAN_OWNERS])

    async def owner(self, kind: str, thing_id: str) -> str | None:
        async with self._transaction(single=True) as conn:
            row = await (await conn.execute(_OWNER, (kind, thing_id))).fetchone()
        return None if row is None else str(row[0])

    async def add_usage(self, rows: list[UsageRow]) -> None:
        if not rows:
            return
        params = [usage_params(r) for r in rows]
        async with self._transaction() as conn, conn.cursor() as cur:
            await cur.executemany(_USAGE_ADD, params)

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
        given |= {"since": since, "until": until}
        where = [f"{test} %({name})s" for name, test in USAGE_FILTERS if given[name] is not None]
        sql = (
            "SELECT day, key_id, tenant, model, upstream, requests, prompt_tokens, "  # noqa: S608 - constants; values bound
            "completion_tokens, cents FROM key_usage"
            + (" WHERE " + " AND ".join(where) if where else "")
            + " ORDER BY day, key_id, model, upstream"
        )
        async with self._transaction(single=True) as conn:
            rows = await (await conn.execute(sql, given)).fetchall()
        return [
            UsageRow(r[0], r[1], r[2], r[3], r[4], int(r[5]), int(r[6]), int(r[7]), r[8])
            for r in rows
        ]
