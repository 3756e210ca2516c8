"""``/admin/keys``: a key is shown once, stored as a hash, audited; every route wants the admin
token."""

from __future__ import annotations

import hashlib

import aiohttp
import pytest
from keyed import ADMIN, ENVIRON, create_key, keyed_config

from harness import serving

ROUTES = [
    ("GET", "/admin/keys"),
    ("POST", "/admin/keys"),
    ("GET", "/admin/keys/key_0"),
    ("PATCH", "/admin/keys/key_0"),
    ("DELETE", "/admin/keys/key_0"),
    ("POST", "/admin/keys/key_0/rotate"),
    ("GET", "/admin/usage"),
]


@pytest.mark.parametrize(("method", "path"), ROUTES)
async def test_every_key_route_refuses_a_wrong_admin_token_and_a_client_key(
    sqlite_dsn: str, http: aiohttp.ClientSession, method: str, path: str
) -> None:
    config = keyed_config(sqlite_dsn, ["http://127.0.0.1:9"], ["m"])
    async with serving(config, environ=ENVIRON) as gw:
        client = await create_key(http, gw.url)
        for offered in ("wrong", client["key"]):
            headers = {"Authorization": f"Bearer {offered}"}
            async with http.request(method, gw.url + path, headers=headers, json={}) as resp:
                body = await resp.json()
            assert (401, "UNAUTHORIZED") == (resp.status, body["error"]["code"])


async def test_a_created_key_is_shown_once_and_stored_only_as_its_hash(
    dsn: str, http: aiohttp.ClientSession
) -> None:
    config = keyed_config(dsn, ["http://127.0.0.1:9"], ["m"])
    async with serving(config, environ=ENVIRON) as gw:
        created = await create_key(
            http, gw.url, models=["m"], max_class="batch", limits={"requests_per_min": 5}
        )
        async with http.get(gw.url + f"/admin/keys/{created['id']}", headers=ADMIN) as resp:
            shown = await resp.json()
        async with http.get(gw.url + "/admin/keys", headers=ADMIN) as resp:
            listed = await resp.json()
        stored = await gw.gateway.store.key_by_digest(
            hashlib.sha256(created["key"].encode()).hexdigest()
        )
        audit = await gw.gateway.store.list_audit(action="key.created")
    secret = created.pop("key")
    assert secret.startswith("gk-")
    assert created["prefix"] == secret[:11]
    assert "key" not in shown
    assert created == shown
    assert [created] == listed["data"]
    assert stored is not None
    assert created["id"] == stored.id
    assert 5 == shown["limits"]["requests_per_min"]
    assert "batch" == shown["max_class"]
    assert [f"key:{created['id']}"] == [event.subject for event in audit]
    assert secret not in str(audit[0].detail)


async def test_update_rotate_and_revoke_are_audited_with_the_actor(
    dsn: str, http: aiohttp.ClientSession
) -> None:
    config = keyed_config(dsn, ["http://127.0.0.1:9"], ["m"])
    async with serving(config, environ=ENVIRON) as gw:
        created = await create_key(http, gw.url)
        url = gw.url + f"/admin/keys/{created['id']}"
        headers = {**ADMIN, "X-Gpugate-Actor": "alice"}
        async with http.patch(url, json={"models": ["m"]}, headers=headers) as resp:
            updated = await resp.json()
        async with http.post(url + "/rotate", headers=headers) as resp:
            rotated = await resp.json()
        async with http.delete(url, headers=headers) as resp:
            revoked = await resp.json()
        events = await gw.gateway.store.list_audit(subject=f"key:{created['id']}")
    assert ["m"] == updated["models"]
    assert "app" == updated["name"]
    assert rotated["key"] != created["key"]
    assert rotated["prefix"] == rotated["key"][:11]
    assert revoked["revoked_at"] is not None
    assert ["key.revoked", "key.rotated", "key.updated", "key.created"] == [
        e.action for e in events
    ]
    assert ["admin:alice"] * 3 == [e.actor for e in events[:3]]


async def test_a_revoked_key_is_not_rotated_into_a_secret_that_would_never_work(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    config = keyed_config(sqlite_dsn, ["http://127.0.0.1:9"], ["m"])
    async with serving(config, environ=ENVIRON) as gw:
        created = await create_key(http, gw.url)
        url = gw.url + f"/admin/keys/{created['id']}"
        async with http.delete(url, headers=ADMIN):
            pass
        async with http.post(url + "/rotate", headers=ADMIN) as resp:
            status, body = resp.status, await resp.json()
        events = await gw.gateway.store.list_audit(subject=f"key:{created['id']}")
    assert (409, "KEY_REVOKED") == (status, body["error"]["code"])
    assert "key" not in body
    assert ["key.revoked", "key.created"] == [e.action for e in events]


async def test_an_unknown_key_id_is_404_and_a_bad_body_names_the_key_path(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    config = keyed_config(sqlite_dsn, ["http://127.0.0.1:9"], ["m"])
    async with serving(config, environ=ENVIRON) as gw:
        async with http.get(gw.url + "/admin/keys/key_nope", headers=ADMIN) as resp:
            missing = await resp.json()
        body = {"name": "x", "tenant": "a b", "limits": {"requests_per_min": 0}}
        async with http.post(gw.url + "/admin/keys", json=body, headers=ADMIN) as resp:
            bad = await resp.json()
    assert "KEY_NOT_FOUND" == missing["error"]["code"]
    assert "BAD_REQUEST" == bad["error"]["code"]
    assert "tenant" in bad["error"]["message"]
    assert "limits.requests_per_min" in bad["error"]["message"]
