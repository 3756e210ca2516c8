"""Finding 7 (issue #15): the console shares its origin with proxied content, and nothing kept
an upstream's HTML from running as that origin (and reading the console's CSRF token), nor
another site from framing the console.

Console responses now carry a strict Content-Security-Policy (own script and stylesheet only,
``frame-ancestors 'none'``) and the usual companions; proxied responses of ``/u/`` and
``/azure-di/`` carry ``Content-Security-Policy: sandbox`` and ``nosniff``.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

import aiohttp
import pytest
from html_upstream import PAGE, html_upstream

from console.console_rig import ENV, Console
from gpugate.web.response_headers import CONSOLE_CSP
from harness import make_config, serving, upstream

CONSOLE_PATHS = ("", "/runtimes", "/jobs", "/audit", "/config", "/login", "/static/console.js")
_INLINE = re.compile(r"<script(?![^>]*\bsrc=)[^>]*>|\sstyle=|\son[a-z]+=", re.IGNORECASE)


@pytest.fixture
async def console(sqlite_dsn: str) -> AsyncIterator[Console]:
    async with html_upstream() as web, html_upstream(status=202) as di:
        config = make_config(
            sqlite_dsn,
            [
                upstream("m1", [web], ["m1"]),
                upstream("web", [web], ["unused"]),
                upstream("azure", [di], ["prebuilt-read"], kind="azure-di", api_key_env="DI_KEY"),
            ],
        )
        async with serving(config, environ={**ENV, "DI_KEY": "di-key"}) as gw:
            jar = aiohttp.CookieJar(unsafe=True)
            async with aiohttp.ClientSession(cookie_jar=jar) as http:
                yield Console(http, gw, None)  # type: ignore[arg-type]  # no exporter here


async def test_finding7_every_console_response_forbids_framing_sniffing_and_foreign_scripts(
    console: Console,
) -> None:
    await console.login()
    seen = {}
    for path in (*CONSOLE_PATHS, "/no-such-page"):
        async with console.http.get(console.url + path, allow_redirects=False) as resp:
            seen[path] = (
                resp.headers.get("Content-Security-Policy"),
                resp.headers.get("X-Frame-Options"),
                resp.headers.get("X-Content-Type-Options"),
                resp.headers.get("Referrer-Policy"),
            )
    expected = (CONSOLE_CSP, "DENY", "nosniff", "no-referrer")
    assert dict.fromkeys(seen, expected) == seen
    assert "frame-ancestors 'none'" in CONSOLE_CSP
    assert "script-src 'self'" in CONSOLE_CSP


async def test_finding7_console_pages_have_no_inline_script_or_style_the_policy_would_block(
    console: Console,
) -> None:
    await console.login()
    pages = [await console.page(path) for path in CONSOLE_PATHS[:-1]]
    assert [200] * len(pages) == [status for status, _ in pages]
    assert [] == [found for _, text in pages for found in _INLINE.findall(text)]


async def test_finding7_proxied_html_under_u_is_sandboxed_and_not_sniffed(console: Console) -> None:
    async with console.http.get(console.gw.url + "/u/web/index.html") as resp:
        body = await resp.read()
        headers = resp.headers
    assert (200, PAGE) == (resp.status, body)
    assert "sandbox" in headers.getall("Content-Security-Policy")
    assert "nosniff" == headers["X-Content-Type-Options"]


async def test_finding7_proxied_html_under_azure_di_is_sandboxed_and_not_sniffed(
    console: Console,
) -> None:
    url = console.gw.url + "/azure-di/documentintelligence/documentModels/prebuilt-read:analyze"
    async with console.http.post(url, data=b"%PDF", params={"api-version": "2024-11-30"}) as resp:
        await resp.read()
        headers = resp.headers
    assert 202 == resp.status
    assert "sandbox" in headers.getall("Content-Security-Policy")
    assert "nosniff" == headers["X-Content-Type-Options"]
