"""Finding 7 (issue #15): the admin API and the console could only share the data plane's
listener (and so its origin and its exposure). ``admin_listen: HOST:PORT`` serves ``/admin`` and
``/console`` on a listener of their own, and then not on the main one."""

from __future__ import annotations

import aiohttp
import pytest
from tls_rig import serving_as_serve_does

from console.console_rig import ENV, TOKEN
from gpugate.config import config_from_document
from gpugate.errors import ConfigError
from harness import make_config, model_servers, upstream

ADMIN = {"Authorization": f"Bearer {TOKEN}"}


async def status(http: aiohttp.ClientSession, url: str) -> int:
    async with http.get(url, headers=ADMIN, allow_redirects=False) as resp:
        return resp.status


async def test_finding7_with_admin_listen_the_admin_plane_is_served_only_on_its_listener(
    sqlite_dsn: str,
) -> None:
    async with model_servers(("s1", ["m1"])) as (s1,):
        config = make_config(sqlite_dsn, [upstream("u", [s1.url], ["m1"])])
        async with (
            serving_as_serve_does(config, environ=ENV, admin=True) as gw,
            aiohttp.ClientSession() as http,
        ):
            assert gw.admin_url is not None
            on_main = {p: await status(http, gw.url + p) for p in ("/admin/upstreams", "/console")}
            on_admin = {
                p: await status(http, gw.admin_url + p)
                for p in ("/admin/upstreams", "/console/login", "/v1/models", "/u/u/v1/models")
            }
            models = await status(http, gw.url + "/v1/models")
    assert {"/admin/upstreams": 404, "/console": 404} == on_main
    assert {
        "/admin/upstreams": 200,
        "/console/login": 200,
        "/v1/models": 404,
        "/u/u/v1/models": 404,
    } == on_admin
    assert 200 == models


def test_admin_listen_needs_a_port_of_its_own() -> None:
    with pytest.raises(ConfigError) as caught:
        config_from_document(
            {
                "listen": "0.0.0.0:8080",
                "admin_listen": "127.0.0.1:8080",
                "upstreams": [{"id": "u", "url": "http://127.0.0.1:9", "models": ["m"]}],
            }
        )
    assert ["admin_listen"] == [problem.path for problem in caught.value.problems]
