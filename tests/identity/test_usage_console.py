"""The console's Usage page: a bar per day and the totals per tenant and key, behind the
console's login like every page."""

from __future__ import annotations

import aiohttp
from keyed import ENVIRON, TOKEN, bearer, chat, create_key, keyed_config

from harness import model_servers, serving


async def test_the_usage_page_shows_a_day_s_bar_and_each_tenant_and_key(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    async with model_servers(("u", ["m"])) as (server,):
        config = keyed_config(sqlite_dsn, [server.url], ["m"])
        async with serving(config, environ=ENVIRON) as gw:
            created = await create_key(http, gw.url, name="ci-bot", tenant="search")
            async with http.post(
                gw.url + "/v1/chat/completions", json=chat(), headers=bearer(created["key"])
            ) as resp:
                assert 200 == resp.status
            jar = aiohttp.CookieJar(unsafe=True)
            async with aiohttp.ClientSession(cookie_jar=jar) as browser:
                async with browser.get(gw.url + "/console/usage", allow_redirects=False) as r:
                    anonymous = r.status
                form = {"token": TOKEN, "name": "alice", "next": "/console"}
                async with browser.post(
                    gw.url + "/console/login", data=form, allow_redirects=False
                ) as r:
                    assert 303 == r.status
                async with browser.get(gw.url + "/console/usage") as r:
                    page = await r.text()
    assert 303 == anonymous  # to the login page
    assert 'id="usage-chart"' in page
    assert page.count('class="bar"') == 1
    assert "<td>search</td>" in page
    assert created["id"] in page
    assert "ci-bot" in page
    assert created["key"] not in page
