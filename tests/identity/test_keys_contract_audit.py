"""Client identity read back through a real ``gpugate serve`` (DESIGN §2a, §3 wave 2, §7;
docs/keys.md), where the running program said something other than the contract or its docs.

Each test starts ``gpugate serve`` as a process in ``auth.mode: keys`` in front of a fake model
server on loopback and talks to it as a client, an operator or the CLI would.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from keyed import ADMIN, ENVIRON, TOKEN, bearer, chat, create_key

from gpugate.config import GatewayConfig
from harness import make_config, model_servers, upstream
from workers.processes import serve_process, write_config

CHAT = "/v1/chat/completions"
SECRET = "gk-audit-bootstrap-" + "s" * 32


@contextlib.asynccontextmanager
async def gateway(
    config: GatewayConfig, environ: Mapping[str, str] | None = None
) -> AsyncIterator[tuple[str, Path]]:
    """``gpugate serve`` of ``config`` until the block ends: its URL and its log file."""
    async with serve_process(config, workers=None, environ={**ENVIRON, **(environ or {})}) as (
        url,
        _,
        log,
    ):
        yield url, log


def keyed(dsn: str, ups: list[dict[str, Any]], **auth: Any) -> GatewayConfig:
    return make_config(dsn, ups, auth={"mode": "keys", **auth})


def idle(dsn: str, **auth: Any) -> GatewayConfig:
    """A keyed config whose one upstream nothing answers (for the admin API alone)."""
    return keyed(dsn, [upstream("u", ["http://127.0.0.1:9"], ["m"])], **auth)


async def post_key(http: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> tuple[int, Any]:
    """``POST /admin/keys`` of ``body``: its status and JSON answer."""
    async with http.post(url + "/admin/keys", json=body, headers=ADMIN) as resp:
        return resp.status, await resp.json()


# -- GET /v1/models lists only what the key can use ---------------------------------------------


async def test_the_model_list_of_a_key_without_allow_external_holds_only_models_it_can_use(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    """A model an external upstream serves is 403 EXTERNAL_UPSTREAM_FORBIDDEN for such a key
    (docs/keys.md), an inside upstream serving it too or not; the list showed it."""
    async with model_servers(("inside", ["m", "own"]), ("outside", ["m", "cloud"])) as servers:
        inside, outside = servers
        ups = [
            upstream("inside", [inside.url], ["m", "own"]),
            upstream("outside", [outside.url], ["m", "cloud"], external=True),
        ]
        async with gateway(keyed(sqlite_dsn, ups)) as (url, _):
            secret = (await create_key(http, url))["key"]
            async with http.get(url + "/v1/models", headers=bearer(secret)) as resp:
                listed = [m["id"] for m in (await resp.json())["data"]]
            answers = {}
            for model in ("m", "own", "cloud"):
                async with http.post(url + CHAT, json=chat(model), headers=bearer(secret)) as r:
                    answers[model] = (r.status, (await r.json()).get("error", {}).get("code"))
    assert ["own"] == listed
    assert (200, None) == answers["own"]
    assert (403, "EXTERNAL_UPSTREAM_FORBIDDEN") == answers["m"]
    assert (403, "EXTERNAL_UPSTREAM_FORBIDDEN") == answers["cloud"]


# -- POST/PATCH /admin/keys: expires_at is an RFC 3339 time --------------------------------------


@pytest.mark.parametrize("value", [4102444800, "4102444800", "2100-01-01", "2100-01-01T00:00Z"])
async def test_expires_at_that_is_not_an_rfc3339_time_is_400_naming_it(
    sqlite_dsn: str, http: aiohttp.ClientSession, value: object
) -> None:
    """Unix seconds (as a number or a string) were taken as a moment."""
    async with gateway(idle(sqlite_dsn)) as (url, _):
        created = await post_key(http, url, {"name": "a", "tenant": "t", "expires_at": value})
        key = await create_key(http, url)
        async with http.patch(
            url + f"/admin/keys/{key['id']}", json={"expires_at": value}, headers=ADMIN
        ) as resp:
            patched = (resp.status, await resp.json())
        fine = {"name": "b", "tenant": "t", "expires_at": "2100-01-01T00:00:00Z"}
        status, answer = await post_key(http, url, fine)
        accepted = (status, answer.get("expires_at"))
    for status, answer in (created, patched):
        assert (400, "BAD_REQUEST") == (status, answer["error"]["code"])
        assert "expires_at" in answer["error"]["message"]
    assert (201, "2100-01-01T00:00:00+00:00") == accepted


# -- bootstrap keys: the fields of POST /admin/keys, checked as it checks them -----------------


def _boot(entries: list[dict[str, Any]]) -> dict[str, str]:
    return {"BOOT_KEYS": json.dumps(entries)}


async def test_a_bootstrap_key_s_expires_at_is_kept(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    """The entry's `expires_at` was dropped: the key never expired."""
    past = (datetime.now(UTC) - timedelta(minutes=1)).isoformat()
    entries = [{"name": "old", "tenant": "ops", "key": SECRET, "expires_at": past}]
    async with model_servers(("u", ["m"])) as (server,):
        config = keyed(
            sqlite_dsn, [upstream("u", [server.url], ["m"])], bootstrap_keys_env="BOOT_KEYS"
        )
        async with gateway(config, _boot(entries)) as (url, _):
            async with http.post(url + CHAT, json=chat(), headers=bearer(SECRET)) as r:
                expired = (r.status, (await r.json())["error"]["message"])
            async with http.get(url + "/admin/keys/boot-old", headers=ADMIN) as r:
                shown = (await r.json())["expires_at"]
    assert 401 == expired[0]
    assert "expired" in expired[1]
    assert datetime.fromisoformat(past) == datetime.fromisoformat(shown)


@pytest.mark.parametrize(
    ("field", "value", "where"),
    [
        ("limit", {"requests_per_min": 1}, "BOOT_KEYS[0].limit"),
        ("models", "m", "BOOT_KEYS[0].models"),
        ("allow_external", "yes", "BOOT_KEYS[0].allow_external"),
        ("limits", {"requests_per_min": -5}, "BOOT_KEYS[0].limits.requests_per_min"),
        ("limits", {"rpm": 5}, "BOOT_KEYS[0].limits.rpm"),
        ("expires_at", "tomorrow", "BOOT_KEYS[0].expires_at"),
        ("expires_at", 4102444800, "BOOT_KEYS[0].expires_at"),
    ],
)
def test_gpugate_serve_refuses_a_bootstrap_entry_post_admin_keys_would_refuse(
    sqlite_dsn: str, tmp_path: Path, field: str, value: object, where: str
) -> None:
    """`models: "m"` became the models ("m",); `"yes"` became false; a negative or misspelled
    limit, an unknown field, a bad `expires_at` were taken without a word."""
    entry = {"name": "ci", "tenant": "ops", "key": SECRET, field: value}
    path = write_config(idle(sqlite_dsn, bootstrap_keys_env="BOOT_KEYS"), tmp_path)
    env = {**os.environ, **ENVIRON, **_boot([entry])}
    command = [sys.executable, "-m", "gpugate", "serve", "--config", str(path)]
    try:
        done = subprocess.run(
            [*command, "--listen", "127.0.0.1:0"],
            capture_output=True,
            text=True,
            env=env,
            timeout=30,
            check=False,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"gpugate serve started with the bootstrap entry {entry}")
    assert 1 == done.returncode, done.stderr[-2000:]
    assert where in done.stderr
    assert "Traceback" not in done.stderr
    assert SECRET not in done.stderr + done.stdout


# -- bootstrap keys: a revocation survives a restart ------------------------------------------


async def test_a_revoked_bootstrap_key_stays_revoked_after_a_restart_until_its_secret_changes(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    """Every start stored the entry again un-revoked: an operator's revocation of a leaked
    bootstrap key ended with the next start of any replica."""
    entries = [{"name": "ci", "tenant": "ops", "key": SECRET}]
    async with model_servers(("u", ["m"])) as (server,):
        config = keyed(
            sqlite_dsn, [upstream("u", [server.url], ["m"])], bootstrap_keys_env="BOOT_KEYS"
        )
        async with gateway(config, _boot(entries)) as (url, _):
            async with http.delete(url + "/admin/keys/boot-ci", headers=ADMIN) as r:
                assert 200 == r.status
        async with gateway(config, _boot(entries)) as (url, _):
            async with http.post(url + CHAT, json=chat(), headers=bearer(SECRET)) as r:
                after_restart = (r.status, (await r.json())["error"]["message"])
        entries[0]["key"] = SECRET + "new"  # a new secret in the environment: a fresh key
        async with gateway(config, _boot(entries)) as (url, _):
            async with http.post(url + CHAT, json=chat(), headers=bearer(SECRET + "new")) as r:
                new_secret = r.status
    assert 401 == after_restart[0]
    assert "revoked" in after_restart[1]
    assert 200 == new_secret


# -- PATCH /admin/keys/{id}: a null that cannot clear its field is refused ------------------------


async def test_patch_refuses_a_null_that_cannot_clear_its_field_and_clears_those_that_can(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    """`{"name": null}` (or tenant, max_class, allow_external) was a 200 that changed nothing."""
    async with gateway(idle(sqlite_dsn)) as (url, _):
        key = await create_key(
            http,
            url,
            models=["m"],
            limits={"requests_per_min": 5},
            expires_at="2100-01-01T00:00:00+00:00",
            allow_external=True,
        )
        where = url + f"/admin/keys/{key['id']}"
        refused = {}
        for name in ("name", "tenant", "max_class", "allow_external"):
            async with http.patch(where, json={name: None}, headers=ADMIN) as resp:
                refused[name] = (resp.status, await resp.json())
        async with http.get(where, headers=ADMIN) as resp:
            unchanged = await resp.json()
        cleared = {"models": None, "limits": None, "expires_at": None}
        async with http.patch(where, json=cleared, headers=ADMIN) as resp:
            after = (resp.status, await resp.json())
    for name, (status, answer) in refused.items():
        assert (400, "BAD_REQUEST") == (status, answer["error"]["code"]), name
        assert f"{name}: " in answer["error"]["message"]
    assert {k: v for k, v in key.items() if k != "key"} == unchanged
    assert 200 == after[0]
    assert (None, None) == (after[1]["models"], after[1]["expires_at"])
    assert all(limit is None for limit in after[1]["limits"].values())


async def test_a_patch_takes_effect_at_once_on_the_replica_that_made_it(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    """docs/keys.md: the replica that revokes, rotates or changes a key drops its cache at once.
    A change through PATCH did not: the key's cached view served on until `key_cache_s` ran
    out (an hour here, so the old behaviour cannot pass by being slow)."""
    async with model_servers(("u", ["m", "m2"])) as (server,):
        ups = [upstream("u", [server.url], ["m", "m2"])]
        async with gateway(keyed(sqlite_dsn, ups, key_cache_s=3600)) as (url, _):
            key = await create_key(http, url)
            where, headers = url + f"/admin/keys/{key['id']}", bearer(key["key"])
            async with http.post(url + CHAT, json=chat("m2"), headers=headers) as resp:
                before = resp.status  # the key is in this replica's cache now
            async with http.patch(where, json={"models": ["m"]}, headers=ADMIN) as resp:
                assert 200 == resp.status
            async with http.post(url + CHAT, json=chat("m2"), headers=headers) as resp:
                narrowed = (resp.status, (await resp.json())["error"]["code"])
            past = (datetime.now(UTC) - timedelta(minutes=1)).isoformat()
            async with http.patch(where, json={"expires_at": past}, headers=ADMIN) as resp:
                assert 200 == resp.status
            async with http.post(url + CHAT, json=chat("m"), headers=headers) as resp:
                expired = resp.status
    assert 200 == before
    assert (403, "MODEL_NOT_ALLOWED") == narrowed
    assert 401 == expired


@pytest.mark.parametrize(
    ("before", "after", "code"),
    [
        ({"requests_per_min": 200}, {"requests_per_min": 1}, "RATE_LIMITED"),
        ({"daily_tokens": 100000}, {"daily_tokens": 10}, "BUDGET_EXCEEDED"),
    ],
)
async def test_a_lowered_limit_is_not_passed_by_what_was_leased_under_the_old_one(
    sqlite_dsn: str,
    http: aiohttp.ClientSession,
    before: dict[str, int],
    after: dict[str, int],
    code: str,
) -> None:
    """A replica leases a slice of a limit (1/20 of a minute's, 1/100 of a day's) and served it
    out after the limit was lowered: 200 requests a minute cut to 1 let 9 more through that
    minute, 100,000 tokens a day cut to 10 let 1,000 more through that day."""
    async with model_servers(("u", ["m"])) as (server,):
        async with gateway(keyed(sqlite_dsn, [upstream("u", [server.url], ["m"])])) as (url, _):
            key = await create_key(http, url, limits=before)
            headers, small = bearer(key["key"]), chat(max_tokens=5)
            async with http.post(url + CHAT, json=small, headers=headers) as resp:
                first = resp.status  # a slice of the old limit leased here
            where = url + f"/admin/keys/{key['id']}"
            async with http.patch(where, json={"limits": after}, headers=ADMIN) as resp:
                assert 200 == resp.status
            answers = []
            for _ in range(3):
                async with http.post(url + CHAT, json=small, headers=headers) as resp:
                    answers.append((resp.status, (await resp.json()).get("error", {}).get("code")))
    assert 200 == first
    assert [(429, code)] * 3 == answers


async def test_post_takes_limits_null_as_no_limits_as_patch_does(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    """`"limits": null` was a 400 on create ("expected a mapping") and no limits on PATCH."""
    async with gateway(idle(sqlite_dsn)) as (url, _):
        created = await post_key(http, url, {"name": "a", "tenant": "t", "limits": None})
    assert 201 == created[0], created[1]
    assert {"requests_per_min", "tokens_per_min", "concurrency", "daily_tokens", "daily_cents"} == {
        name for name, limit in created[1]["limits"].items() if limit is None
    }


# -- a request no window of a limit can hold says so -----------------------------------------


@pytest.mark.parametrize(
    ("limits", "code", "name"),
    [
        ({"tokens_per_min": 100}, "TOKEN_LIMITED", "tokens_per_min"),
        ({"daily_tokens": 100}, "BUDGET_EXCEEDED", "daily_tokens"),
    ],
)
async def test_a_request_whose_estimate_is_more_than_the_whole_limit_is_told_so(
    sqlite_dsn: str, http: aiohttp.ClientSession, limits: dict[str, int], code: str, name: str
) -> None:
    """A key with 100 tokens a minute was told it "is over its limit" with a Retry-After for a
    request without max_tokens (estimated at 256 + its prompt), although it had used nothing
    and no retry could ever succeed."""
    async with model_servers(("u", ["m"])) as (server,):
        config = keyed(sqlite_dsn, [upstream("u", [server.url], ["m"])])
        async with gateway(config) as (url, _):
            secret = (await create_key(http, url, limits=limits))["key"]
            async with http.post(url + CHAT, json=chat(), headers=bearer(secret)) as resp:
                refused = (resp.status, resp.headers.get("Retry-After"), await resp.json())
            small = chat(max_tokens=10)
            async with http.post(url + CHAT, json=small, headers=bearer(secret)) as resp:
                served = resp.status
    status, retry_after, body = refused
    assert (429, code) == (status, body["error"]["code"])
    assert retry_after is not None
    assert int(retry_after) >= 1
    assert f"whole {name} (100)" in body["error"]["message"]
    assert "max_tokens" in body["error"]["message"]
    assert 200 == served


# -- gpugate keys: an expired key is not listed as active; update can end an expiry -----------


async def _cli(*argv: str) -> tuple[int, str, str]:
    env = {**os.environ, "GPUGATE_ADMIN_TOKEN": TOKEN}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gpugate", *argv,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_keys_list_says_expired_for_an_expired_key_and_update_can_end_its_expiry(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    past = (datetime.now(UTC) - timedelta(minutes=1)).isoformat()
    async with gateway(idle(sqlite_dsn)) as (url, _):
        old = await create_key(http, url, name="old", expires_at=past)
        live = await create_key(http, url, name="live")
        listed = await _cli("keys", "list", "--gateway", url)
        updated = await _cli("keys", "update", old["id"], "--expires-at", "never", "--gateway", url)
        relisted = await _cli("keys", "list", "--gateway", url)
    lines = {line.split()[0]: line.split()[-1] for line in listed[1].splitlines()}
    assert 0 == listed[0]
    assert {old["id"]: "expired", live["id"]: "active"} == lines
    assert 0 == updated[0], updated[2]
    assert json.loads(updated[1])["expires_at"] is None
    assert f"{old['id']}" in relisted[1]
    assert all(line.endswith("active") for line in relisted[1].splitlines())
