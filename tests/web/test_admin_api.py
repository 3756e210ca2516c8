"""The admin API: the token guards every route; the upstream view tells the truth."""

from __future__ import annotations

import aiohttp

from harness import make_config, model_servers, serving, upstream

TOKEN = "s3cret-admin"


async def test_the_admin_api_refuses_everything_without_a_configured_token(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    config = make_config(sqlite_dsn, [upstream("u", ["http://127.0.0.1:9"], ["m"])])
    async with serving(config, environ={}) as gw:
        headers = {"Authorization": "Bearer anything"}
        async with http.get(gw.url + "/admin/upstreams", headers=headers) as resp:
            body = await resp.json()
    assert (401, "UNAUTHORIZED") == (resp.status, body["error"]["code"])
    assert "admin_token_env" in body["error"]["message"]


async def test_a_missing_or_wrong_token_is_401_and_the_right_one_is_served(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    async with model_servers(("u", ["m"])) as (server,):
        server_url = server.url
        config = make_config(sqlite_dsn, [upstream("u", [server_url], ["m"], gpu_ids=[0])])
        async with serving(config, environ={"GPUGATE_ADMIN_TOKEN": TOKEN}) as gw:
            url = gw.url + "/admin/upstreams"
            async with http.get(url) as missing:
                assert 401 == missing.status
            async with http.get(url, headers={"Authorization": "Bearer nope"}) as wrong:
                assert 401 == wrong.status
            async with http.get(url, headers={"Authorization": f"Bearer {TOKEN}"}) as ok:
                body = await ok.json()
    assert 200 == ok.status
    (view,) = body["upstreams"]
    assert {"id": "u", "models": ["m"], "gpu_ids": [0], "out_of_rotation": None} == {
        k: view[k] for k in ("id", "models", "gpu_ids", "out_of_rotation")
    }
    assert [server_url] == [ep["url"] for ep in view["endpoints"]]
    assert "healthy" == view["endpoints"][0]["health"]
