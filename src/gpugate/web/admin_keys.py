"""``/admin/keys`` (create, list, show, update, rotate, revoke) and ``/admin/usage`` (issue #16).

Every route needs the admin token. A key's secret is in the answer of a create or a rotation
only; it is stored as a hash and never shown again (nor logged, nor audited).
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any

from starlette.responses import Response

from gpugate.core.classes import RequestClass
from gpugate.core.keys import Limits
from gpugate.errors import BadRequest, KeyNotFound
from gpugate.services.keys import KeySpec
from gpugate.web.api import operation, route
from gpugate.web.schemas.admin import AdminHeaders
from gpugate.web.schemas.keys import (
    KeyCreate,
    KeyIssued,
    KeyList,
    KeyListQuery,
    KeyPath,
    KeyUpdate,
    KeyView,
    UsageQuery,
    UsageRowView,
    UsageTotal,
    UsageView,
)
from gpugate.web.schemas.operation import Answer, Security
from gpugate.wiring import Gateway

if TYPE_CHECKING:
    from gpugate.services.keys import Keys
    from gpugate.store.keys import UsageRow

TAGS = ("admin",)
admin = partial(operation, Security.ADMIN, tags=TAGS)
NOT_FOUND = {404: "KEY_NOT_FOUND"}
#: ``PATCH`` fields a null cannot clear (``models``, ``runners``: all; ``limits``: none; no
#: ``expires_at``: never)
NOT_NULL = frozenset({"name", "tenant", "max_class", "allow_external"})


def _keys(gateway: Gateway) -> Keys:
    return gateway.keys


def _tuple(values: list[str] | None) -> tuple[str, ...] | None:
    return None if values is None else tuple(values)


@admin(responses={201: Answer("the key, with its secret (`key`), shown this once", KeyIssued)})
async def create_key(gateway: Gateway, headers: AdminHeaders, body: KeyCreate) -> Response:
    """Create a client key; the answer's `key` is the secret, shown only here.

    The key is stored as a SHA-256 hash with its public `prefix`; audited (`key.created`).
    """
    spec = KeySpec(
        name=body.name,
        tenant=body.tenant,
        models=_tuple(body.models),
        max_class=RequestClass(body.max_class),
        runners=_tuple(body.runners),
        allow_external=body.allow_external,
        limits=Limits() if body.limits is None else Limits(**body.limits.model_dump()),
        expires_at=body.expires_at,
    )
    issued = await _keys(gateway).create(spec, actor=headers.actor)
    view = KeyIssued.of_issued(issued.key, issued.secret)
    return Response(view.to_bytes(), 201, media_type="application/json")


@admin(responses={200: Answer("every key (of `tenant`), oldest first", KeyList)})
async def list_keys(gateway: Gateway, query: KeyListQuery) -> KeyList:
    """Every client key, revoked ones too (`revoked_at` set); never a secret."""
    keys = await _keys(gateway).all(tenant=query.tenant)
    return KeyList(data=[KeyView.of_key(key) for key in keys])


@admin(responses={200: Answer("the key", KeyView)}, errors=NOT_FOUND)
async def get_key(gateway: Gateway, path: KeyPath) -> KeyView:
    """One client key (never its secret)."""
    key = await _keys(gateway).get(path.id)
    if key is None:
        raise KeyNotFound(f"no client key {path.id!r}")
    return KeyView.of_key(key)


@admin(responses={200: Answer("the key as it is now", KeyView)}, errors=NOT_FOUND)
async def update_key(
    gateway: Gateway, path: KeyPath, headers: AdminHeaders, body: KeyUpdate
) -> KeyView:
    """Change a key's fields (absent ones stay; `limits` is replaced whole); audited.

    Every replica follows within `auth.key_cache_s`. To make `models` or `runners` unlimited
    again, send them as null explicitly (`limits`: null is no limits; `expires_at`: null is
    never); a null `name`, `tenant`, `max_class` or `allow_external` is a 400.
    """
    changes: dict[str, Any] = {}
    cleared = sorted(n for n in body.model_fields_set & NOT_NULL if getattr(body, n) is None)
    if cleared:  # these have no "none" to be: a null would be ignored, so it is refused
        raise BadRequest(
            "; ".join(f"{n}: may not be null (leave it out to keep it)" for n in cleared)
        )
    for name in body.model_fields_set:
        value = getattr(body, name)
        if name in ("models", "runners"):
            changes[name] = _tuple(value)
        elif name == "max_class":
            changes[name] = RequestClass(value)
        elif name == "limits":
            changes[name] = Limits() if value is None else Limits(**value.model_dump())
        else:
            changes[name] = value
    key = await _keys(gateway).update(path.id, changes, actor=headers.actor)
    return KeyView.of_key(key)


@admin(
    responses={200: Answer("the key with its new secret (`key`), shown this once", KeyIssued)},
    errors={**NOT_FOUND, 409: "KEY_REVOKED: a revoked key gets no new secret"},
    body_required=False,
)
async def rotate_key(gateway: Gateway, path: KeyPath, headers: AdminHeaders) -> KeyIssued:
    """Give a key a new secret: the old one stops working (every replica within
    `auth.key_cache_s`); its id, limits and usage stay. Audited (`key.rotated`)."""
    issued = await _keys(gateway).rotate(path.id, actor=headers.actor)
    return KeyIssued.of_issued(issued.key, issued.secret)


@admin(responses={200: Answer("the key, `revoked_at` set", KeyView)}, errors=NOT_FOUND)
async def revoke_key(gateway: Gateway, path: KeyPath, headers: AdminHeaders) -> KeyView:
    """Revoke a key: it stops working on this replica at once, on every other within
    `auth.key_cache_s` (default 2 s). Audited (`key.revoked`); revoking twice changes nothing."""
    return KeyView.of_key(await _keys(gateway).revoke(path.id, actor=headers.actor))


def _total(rows: list[UsageRow]) -> UsageTotal:
    return UsageTotal(
        requests=sum(r.requests for r in rows),
        prompt_tokens=sum(r.prompt_tokens for r in rows),
        completion_tokens=sum(r.completion_tokens for r in rows),
        cents=sum(r.cents for r in rows),
    )


async def usage_view(gateway: Gateway, query: UsageQuery) -> UsageView:
    """The usage rows of ``query`` and their totals (what the console's usage page shows)."""
    await gateway.usage.flush()  # this replica's counts up to now
    rows = await gateway.store.list_usage(
        key_id=query.key,
        tenant=query.tenant,
        model=query.model,
        since=query.since,
        until=query.until,
    )
    by_key: dict[str, list[UsageRow]] = {}
    by_tenant: dict[str, list[UsageRow]] = {}
    for row in rows:
        by_key.setdefault(row.key_id, []).append(row)
        by_tenant.setdefault(row.tenant, []).append(row)
    return UsageView(
        data=[
            UsageRowView(
                day=r.day,
                key=r.key_id,
                tenant=r.tenant,
                model=r.model,
                upstream=r.upstream,
                requests=r.requests,
                prompt_tokens=r.prompt_tokens,
                completion_tokens=r.completion_tokens,
                cents=r.cents,
            )
            for r in rows
        ],
        by_key={k: _total(v) for k, v in by_key.items()},
        by_tenant={t: _total(v) for t, v in by_tenant.items()},
    )


@admin(responses={200: Answer("usage per day, key, model and upstream, with totals", UsageView)})
async def get_usage(gateway: Gateway, query: UsageQuery) -> UsageView:
    """Tokens and cost through client keys, per UTC day, key, model and upstream.

    Filters: `key` (an id), `tenant`, `model`, `from` and `to` (UTC days, inclusive). Other
    replicas' counts arrive within `auth.usage_flush_s`. `cents` uses the model's `price`.
    """
    return await usage_view(gateway, query)


routes = [
    route("/admin/keys", create_key, "POST"),
    route("/admin/keys", list_keys, "GET"),
    route("/admin/keys/{id}", get_key, "GET"),
    route("/admin/keys/{id}", update_key, "PATCH"),
    route("/admin/keys/{id}", revoke_key, "DELETE"),
    route("/admin/keys/{id}/rotate", rotate_key, "POST"),
    route("/admin/usage", get_usage, "GET"),
]
