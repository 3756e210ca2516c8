"""Config versions through the admin API: export, import (replace), versions, rollback, and a
new version taking effect without a restart (DESIGN §2, issue #7 done-when 3)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import aiohttp
import yaml
from ops_rig import ENV, Admin

from harness import make_config, model_servers, serving, upstream

if TYPE_CHECKING:
    from gpugate.config import GatewayConfig


def two_models_config(dsn: str, url: str) -> GatewayConfig:
    return make_config(
        dsn,
        [upstream("u1", [url], ["m1"], max_inflight=8)],
        runtimes=[{"id": "local", "kind": "upstream"}],
    )


def with_second_upstream(document: dict[str, Any], url: str) -> dict[str, Any]:
    changed = json.loads(json.dumps(document))
    changed["upstreams"].append(upstream("u2", [url], ["m2"]))
    return changed


async def test_export_is_the_seeded_document_in_the_files_schema_with_its_version(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    config = two_models_config(sqlite_dsn, "http://127.0.0.1:9")
    async with serving(config, environ=ENV) as gw:
        admin = Admin(http, gw.url)
        as_json = await admin.export()
        as_yaml = await admin.export(yaml=True)
    assert (200, "1") == (as_json.status, as_json.headers["X-Config-Version"])
    assert config.gateway_document() == as_json.body
    assert "application/yaml" == as_yaml.headers["Content-Type"].partition(";")[0]
    assert "1" == as_yaml.headers["X-Config-Version"]
    assert config.gateway_document() == yaml.safe_load(as_yaml.text)


ACCEPTED_AS = {
    "application/yaml": "yaml",
    "Application/YAML": "yaml",
    "text/yaml;q=0.5, */*;q=0.1": "yaml",
    "application/json;q=1, application/yaml;q=0.1": "json",
    "application/yaml;q=0": "json",
    "application/yaml;q=nonsense": "json",
    "application/json, application/yaml": "json",
    "*/*": "json",
    "text/html": "json",
}


async def test_export_follows_the_accept_headers_preference_with_json_on_a_tie(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    async with serving(two_models_config(sqlite_dsn, "http://127.0.0.1:9"), environ=ENV) as gw:
        admin = Admin(http, gw.url)
        served = {
            accept: (await admin.call("GET", "/admin/config", headers={"Accept": accept}))
            for accept in ACCEPTED_AS
        }
    kinds = {
        accept: reply.headers["Content-Type"].partition(";")[0] for accept, reply in served.items()
    }
    assert {accept: f"application/{media}" for accept, media in ACCEPTED_AS.items()} == kinds


async def test_importing_the_exported_document_changes_nothing(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    config = two_models_config(sqlite_dsn, "http://127.0.0.1:9")
    async with serving(config, environ=ENV) as gw:
        admin = Admin(http, gw.url)
        before_json, before_yaml = await admin.export(), await admin.export(yaml=True)
        from_json = await admin.import_text(before_json.text)
        from_yaml = await admin.import_text(before_yaml.text, yaml=True)
        after_json, after_yaml = await admin.export(), await admin.export(yaml=True)
        versions = await admin.call("GET", "/admin/config/versions")
        saved = await gw.gateway.store.list_audit(action="config.saved")
    assert {"version": 1, "changed": False} == from_json.body
    assert {"version": 1, "changed": False} == from_yaml.body
    assert (before_json.text, before_yaml.text) == (after_json.text, after_yaml.text)
    assert [1] == [v["version"] for v in versions.body["versions"]]
    assert [] == saved


async def test_an_invalid_import_reports_every_problem_with_lines_and_changes_nothing(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    broken = """\
upstreams:
  - id: u1
    url: http://127.0.0.1:9
    models: [m1]
    max_inflight: -3
runtimes:
  - {id: local, kind: upstream}
fallback_chain: [local, nowhere]
listen: 0.0.0.0:80
"""
    config = two_models_config(sqlite_dsn, "http://127.0.0.1:9")
    async with serving(config, environ=ENV) as gw:
        admin = Admin(http, gw.url)
        before = await admin.export()
        reply = await admin.import_text(broken, yaml=True)
        after = await admin.export()
        saved = await gw.gateway.store.list_audit(action="config.saved")
        in_effect = gw.gateway.config_version
    assert (422, "CONFIG_INVALID") == (reply.status, reply.code)
    assert "invalid_request_error" == reply.body["error"]["type"]  # the client's document
    problems = {(p["path"], p["line"]) for p in reply.body["error"]["problems"]}
    assert {("upstreams[0].max_inflight", 5), ("fallback_chain[1]", 8), ("listen", 9)} <= problems
    assert (before.text, before.headers["X-Config-Version"]) == (
        after.text,
        after.headers["X-Config-Version"],
    )
    assert ([], 1) == (saved, in_effect)


async def test_broken_json_is_one_problem_with_its_line(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    config = two_models_config(sqlite_dsn, "http://127.0.0.1:9")
    async with serving(config, environ=ENV) as gw:
        reply = await Admin(http, gw.url).import_text('{\n  "upstreams": [,]\n}')
    assert (422, "CONFIG_INVALID") == (reply.status, reply.code)
    assert [2] == [p["line"] for p in reply.body["error"]["problems"]]


async def test_an_import_naming_an_unset_secret_variable_is_refused(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    config = two_models_config(sqlite_dsn, "http://127.0.0.1:9")
    async with serving(config, environ=ENV) as gw:
        admin = Admin(http, gw.url)
        document = (await admin.export()).body
        document["upstreams"][0]["api_key_env"] = "NOT_SET_ANYWHERE"
        reply = await admin.import_text(json.dumps(document))
    assert 422 == reply.status
    unavailable = (
        "environment variable NOT_SET_ANYWHERE is not available to a config import: it must be "
        "set, and allowed by the process (import_env.prefix, import_env.allow, or named by the "
        "config file)"
    )
    assert [("upstreams[0].api_key_env", unavailable)] == [
        (p["path"], p["message"]) for p in reply.body["error"]["problems"]
    ]


async def test_a_changed_import_is_a_new_audited_version_in_effect_without_a_restart(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    async with model_servers(("s1", ["m1"]), ("s2", ["m2"])) as (s1, s2):
        config = two_models_config(sqlite_dsn, s1.url)
        async with serving(config, environ=ENV) as gw:
            admin = Admin(http, gw.url)
            async with http.get(gw.url + "/v1/models") as resp:
                models_before = [m["id"] for m in (await resp.json())["data"]]
            document = with_second_upstream((await admin.export()).body, s2.url)
            reply = await admin.import_text(json.dumps(document))
            async with http.get(gw.url + "/v1/models") as resp:
                models_after = [m["id"] for m in (await resp.json())["data"]]
            body = {"model": "m2", "messages": [{"role": "user", "content": "hi"}]}
            async with http.post(gw.v1 + "/chat/completions", json=body) as chat:
                served_by = chat.headers.get("X-Gateway-Upstream")
            exported = await admin.export()
            (event,) = await gw.gateway.store.list_audit(action="config.saved")
    assert {"version": 2, "changed": True} == reply.body
    assert (["m1"], ["m1", "m2"]) == (models_before, models_after)
    assert (200, "u2") == (chat.status, served_by)
    assert "2" == exported.headers["X-Config-Version"]
    assert ["u1", "u2"] == [u["id"] for u in exported.body["upstreams"]]
    assert ("admin:alice", {"version": 2, "note": "import"}) == (event.actor, event.detail)


async def test_rollback_restores_exactly_the_earlier_version_as_a_new_one(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    config = two_models_config(sqlite_dsn, "http://127.0.0.1:9")
    async with serving(config, environ=ENV) as gw:
        admin = Admin(http, gw.url)
        first = await admin.export(yaml=True)
        changed = with_second_upstream((await admin.export()).body, "http://127.0.0.1:8")
        await admin.import_text(yaml.safe_dump(changed), yaml=True)
        rolled = await admin.call("POST", "/admin/config/rollback/1")
        after = await admin.export(yaml=True)
        versions = await admin.call("GET", "/admin/config/versions")
        models = gw.gateway.registry.models()
    assert {"version": 3, "changed": True, "rolled_back_to": 1} == rolled.body
    assert ("3", first.text) == (after.headers["X-Config-Version"], after.text)
    assert [(3, "rollback to 1", True), (2, "import", False), (1, "seeded", False)] == [
        (v["version"], v["note"], v["current"]) for v in versions.body["versions"]
    ]
    assert "m2" not in models


async def test_rollback_to_a_version_that_does_not_exist_is_404_and_changes_nothing(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    config = two_models_config(sqlite_dsn, "http://127.0.0.1:9")
    async with serving(config, environ=ENV) as gw:
        reply = await Admin(http, gw.url).call("POST", "/admin/config/rollback/7")
        version = gw.gateway.config_version
    assert (404, "UNKNOWN_CONFIG_VERSION", 1) == (reply.status, reply.code, version)


async def test_config_routes_need_the_token_and_a_known_content_type(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    config = two_models_config(sqlite_dsn, "http://127.0.0.1:9")
    async with serving(config, environ=ENV) as gw:
        anonymous = Admin(http, gw.url, token=None)
        replies = [
            await anonymous.export(),
            await anonymous.import_text("{}"),
            await anonymous.call("GET", "/admin/config/versions"),
            await anonymous.call("POST", "/admin/config/rollback/1"),
        ]
        as_text = await Admin(http, gw.url).call(
            "PUT", "/admin/config", data="x", headers={"Content-Type": "text/plain"}
        )
    assert [401] * 4 == [r.status for r in replies]
    assert (400, "BAD_REQUEST") == (as_text.status, as_text.code)


async def test_another_replica_follows_a_new_version_on_its_next_poll(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    async with model_servers(("s1", ["m1"]), ("s2", ["m2"])) as (s1, s2):
        config = two_models_config(sqlite_dsn, s1.url)
        async with serving(config, environ=ENV) as first, serving(config, environ=ENV) as second:
            admin = Admin(http, first.url)
            document = with_second_upstream((await admin.export()).body, s2.url)
            await admin.import_text(json.dumps(document))
            versions = second.gateway.config_versions
            assert versions is not None
            before = (second.gateway.config_version, second.gateway.registry.models())
            applied = await versions.tick()
            after = (second.gateway.config_version, second.gateway.registry.models())
    assert ((1, ["m1"]), True, (2, ["m1", "m2"])) == (before, applied, after)
