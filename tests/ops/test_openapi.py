"""The OpenAPI schema documents every operator-plane route (GET /openapi.json)."""

from __future__ import annotations

import aiohttp

from harness import make_config, serving, upstream

OPERATOR_ROUTES = {
    ("/admin/config", "get"),
    ("/admin/config", "put"),
    ("/admin/config/versions", "get"),
    ("/admin/config/rollback/{version}", "post"),
    ("/admin/runtimes", "get"),
    ("/admin/runtimes/{runtime}", "get"),
    ("/admin/runtimes/{runtime}/enable", "post"),
    ("/admin/runtimes/{runtime}/disable", "post"),
    ("/admin/runtimes/{runtime}/drain", "post"),
    ("/admin/audit", "get"),
}


async def test_each_operator_route_has_a_summary_responses_and_the_admin_scheme(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    config = make_config(sqlite_dsn, [upstream("u", ["http://127.0.0.1:9"], ["m"])])
    async with serving(config) as gw, http.get(gw.url + "/openapi.json") as resp:
        schema = await resp.json()
    documented = {
        (path, method)
        for path, operations in schema["paths"].items()
        for method, operation in operations.items()
        if operation.get("summary") and operation.get("responses")
    }
    assert OPERATOR_ROUTES <= documented
    assert all(
        [{"admin": []}] == schema["paths"][path][method]["security"]
        for path, method in OPERATOR_ROUTES
    )
