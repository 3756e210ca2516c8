"""The config file that runs (DESIGN §2a ``config_source``, issue #19 done-when 1): with the
default ``file``, an edited file becomes the active version at the next start; with ``store``,
and for an unchanged file, the store's version (changed through the admin API) stays."""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING

import aiohttp
import pytest
from ops_rig import ENV, Admin

from gpugate.config.loader import load_config
from harness import model_servers, serving

if TYPE_CHECKING:
    from pathlib import Path

    from gpugate.fleet.model_server import ModelServer


def write_config(path: Path, dsn: str, server: ModelServer, *, source: str = "file") -> None:
    path.write_text(
        f"""\
store: {dsn}
config_source: {source}
blobs: {{dir: {path.parent / "blobs"}}}
upstreams:
  - id: u1
    url: {server.url}
    models: [m1]
""",
        encoding="utf-8",
    )


async def served_by(http: aiohttp.ClientSession, url: str) -> str:
    body = {"model": "m1", "messages": [{"role": "user", "content": "hi"}]}
    async with http.post(url + "/v1/chat/completions", json=body) as resp:
        assert 200 == resp.status, await resp.text()
        return resp.headers["X-Fleet-Server"]


async def test_an_edited_config_file_is_the_active_version_at_the_next_start(
    sqlite_dsn: str, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    path = tmp_path / "gpugate.yaml"
    async with model_servers(("first", ["m1"]), ("second", ["m1"])) as (first, second):
        write_config(path, sqlite_dsn, first)
        async with serving(load_config(path), environ=ENV) as gw:
            assert "first" == await served_by(http, gw.url)
        write_config(path, sqlite_dsn, second)  # the operator fixes the upstream's port
        async with serving(load_config(path), environ=ENV) as gw:
            assert "second" == await served_by(http, gw.url)
            versions = await gw.gateway.store.list_configs()
    assert [(2, "file"), (1, "config-file")] == [(v.version, v.actor) for v in versions]


async def test_with_config_source_store_an_edited_file_does_not_replace_the_stores_version(
    sqlite_dsn: str, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    path = tmp_path / "gpugate.yaml"
    async with model_servers(("first", ["m1"]), ("second", ["m1"])) as (first, second):
        write_config(path, sqlite_dsn, first, source="store")
        async with serving(load_config(path), environ=ENV):
            pass
        write_config(path, sqlite_dsn, second, source="store")
        async with serving(load_config(path), environ=ENV) as gw:
            assert "first" == await served_by(http, gw.url)
            versions = await gw.gateway.store.list_configs()
    assert [1] == [v.version for v in versions]


async def test_an_unchanged_file_keeps_a_version_imported_through_the_admin_api(
    sqlite_dsn: str, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    path = tmp_path / "gpugate.yaml"
    async with model_servers(("first", ["m1"]), ("second", ["m1"])) as (first, second):
        write_config(path, sqlite_dsn, first)
        async with serving(load_config(path), environ=ENV) as gw:
            admin = Admin(http, gw.url)
            exported = (await admin.export()).body
            exported["upstreams"][0]["url"] = second.url
            imported = await admin.import_text(json.dumps(exported))
            assert 200 == imported.status, imported.text
        async with serving(load_config(path), environ=ENV) as gw:  # the same file again
            assert "second" == await served_by(http, gw.url)
            versions = await gw.gateway.store.list_configs()
    assert [2, 1] == [v.version for v in versions]


async def test_a_gateway_without_an_admin_token_says_so_at_start(
    sqlite_dsn: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "gpugate.yaml"
    async with model_servers(("first", ["m1"])) as (first,):
        write_config(path, sqlite_dsn, first)
        with caplog.at_level(logging.WARNING, logger="gpugate"):
            async with serving(load_config(path), environ={}):
                pass
    assert any(
        "no admin token: the variable GPUGATE_ADMIN_TOKEN is unset or empty" in r.getMessage()
        for r in caplog.records
    )
