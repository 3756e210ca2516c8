"""Finding 6 (issue #15): the console's session cookie was never ``Secure``. It is now when the
console is served over TLS (``tls``, see test_finding6_tls.py) or behind a TLS proxy the config
declares (``server.behind_tls_proxy``), and the pages then send Strict-Transport-Security."""

from __future__ import annotations

import aiohttp

from console.console_rig import ENV, TOKEN
from gpugate.web.console import session
from harness import make_config, serving, upstream


async def login_set_cookie(sqlite_dsn: str, **server: object) -> tuple[str, str | None]:
    config = make_config(sqlite_dsn, [upstream("u", ["http://127.0.0.1:9"], ["m"])], server=server)
    async with serving(config, environ=ENV) as gw, aiohttp.ClientSession() as http:
        form = {"token": TOKEN, "name": "alice", "next": "/console"}
        url = gw.url + "/console/login"
        async with http.post(url, data=form, allow_redirects=False) as resp:
            return resp.headers["Set-Cookie"], resp.headers.get("Strict-Transport-Security")


async def test_finding6_behind_a_declared_tls_proxy_the_session_cookie_is_secure(
    sqlite_dsn: str,
) -> None:
    cookie, hsts = await login_set_cookie(sqlite_dsn, behind_tls_proxy=True)
    assert cookie.startswith(f"{session.COOKIE}=")
    assert "secure" in cookie.lower().split("; ")
    assert "max-age=31536000" == hsts


async def test_over_plain_http_without_a_tls_proxy_the_cookie_cannot_be_secure(
    sqlite_dsn: str,
) -> None:
    cookie, hsts = await login_set_cookie(sqlite_dsn)
    assert ("secure" in cookie.lower().split("; "), hsts) == (False, None)
