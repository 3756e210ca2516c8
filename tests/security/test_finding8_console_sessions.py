"""Finding 8 (issue #15): the console had no login throttle, and logging out did not end the
session (a copied cookie stayed valid until it expired, on every replica).

Wrong admin tokens are now throttled per client (console login and admin API share it, in
bounded memory), and a logout revokes the session on the server: at once on that replica, and on
the others as soon as they read the audit log (``REVOCATION_POLL_S``).
"""

from __future__ import annotations

import asyncio

import aiohttp

from console.console_rig import ENV, TOKEN
from gpugate.core.throttle import FailureThrottle, client_key
from gpugate.web.console import session
from gpugate.web.console.revocations import REVOCATION_POLL_S
from harness import RunningGateway, make_config, serving, upstream


def config(dsn: str) -> object:
    return make_config(dsn, [upstream("u", ["http://127.0.0.1:9"], ["m"])])


async def login(
    http: aiohttp.ClientSession, gw: RunningGateway, token: str = TOKEN
) -> tuple[int, str]:
    """POST the login form; (status, the session cookie's value or "")."""
    form = {"token": token, "name": "alice", "next": "/console"}
    async with http.post(gw.url + "/console/login", data=form, allow_redirects=False) as resp:
        await resp.read()
        cookie = resp.cookies.get(session.COOKIE)
        return resp.status, cookie.value if cookie is not None else ""


async def page_with(http: aiohttp.ClientSession, gw: RunningGateway, cookie: str) -> int:
    headers = {"Cookie": f"{session.COOKIE}={cookie}"}
    async with http.get(gw.url + "/console/runtimes", headers=headers, allow_redirects=False) as r:
        return r.status


async def logout_with(http: aiohttp.ClientSession, gw: RunningGateway, cookie: str) -> int:
    headers = {"Cookie": f"{session.COOKIE}={cookie}"}
    async with http.get(gw.url + "/console", headers=headers) as resp:
        text = await resp.text()
    csrf = text.split('name="csrf" value="', 1)[1].split('"', 1)[0]
    async with http.post(
        gw.url + "/console/logout", data={"csrf": csrf}, headers=headers, allow_redirects=False
    ) as resp:
        return resp.status


def test_finding8_the_throttle_lets_five_failures_through_then_one_per_refill() -> None:
    throttle = FailureThrottle(burst=5, refill_s=12.0, max_keys=3)
    for _ in range(5):
        assert throttle.retry_after("a", 100.0) is None
        throttle.failed("a", 100.0)
    assert 12.0 == throttle.retry_after("a", 100.0)
    assert throttle.retry_after("a", 112.0) is None  # one token back after refill_s
    throttle.succeeded("a")
    assert throttle.retry_after("a", 112.0) is None
    for key in ("b", "c", "d", "e"):
        throttle.failed(key, 100.0)
    assert 3 == len(throttle)  # bounded: the client that failed longest ago is forgotten


def test_an_ipv6_client_is_throttled_by_its_64_and_ipv4_by_its_address() -> None:
    assert client_key("2001:db8::1") == client_key("2001:db8::ffff") == "2001:db8::/64"
    assert ("10.0.0.1", "unknown") == (client_key("10.0.0.1"), client_key(None))


GUESSES = FailureThrottle().burst  # the gateway's own throttle: 30 wrong tokens at once


async def test_finding8_the_console_login_refuses_a_client_after_its_wrong_tokens(
    sqlite_dsn: str,
) -> None:
    async with serving(config(sqlite_dsn), environ=ENV) as gw, aiohttp.ClientSession() as http:
        wrong = [(await login(http, gw, "guess"))[0] for _ in range(GUESSES)]
        form = {"token": TOKEN, "name": "alice", "next": "/console"}
        async with http.post(gw.url + "/console/login", data=form, allow_redirects=False) as r:
            throttled = (r.status, r.headers.get("Retry-After"), r.cookies.get(session.COOKIE))
    assert [401] * GUESSES == wrong
    status, retry_after, cookie = throttled
    # the wait for the next try: up to one refill, less the time the 30 tries took
    assert (429, True, None) == (
        status,
        1 <= int(retry_after or 0) <= 4,
        cookie,
    )  # even the right token waits: guessing stops


async def test_finding8_the_admin_api_shares_the_throttle(sqlite_dsn: str) -> None:
    async with serving(config(sqlite_dsn), environ=ENV) as gw, aiohttp.ClientSession() as http:
        statuses = []
        for token in ["guess"] * GUESSES + [TOKEN]:
            headers = {"Authorization": f"Bearer {token}"}
            async with http.get(gw.url + "/admin/upstreams", headers=headers) as resp:
                statuses.append(resp.status)
                code = (await resp.json())["error"]["code"] if resp.status != 200 else None
    assert ([401] * GUESSES + [429], "TOO_MANY_ATTEMPTS") == (statuses, code)


async def test_finding8_a_copied_cookie_stops_working_once_its_session_logged_out(
    sqlite_dsn: str,
) -> None:
    async with serving(config(sqlite_dsn), environ=ENV) as gw, aiohttp.ClientSession() as http:
        _, cookie = await login(http, gw)
        before = await page_with(http, gw, cookie)
        logged_out = await logout_with(http, gw, cookie)
        after = await page_with(http, gw, cookie)
        audit = await gw.gateway.store.list_audit(action="console.logout")
    assert (200, 303, 303) == (before, logged_out, after)
    assert ["console:alice"] == [event.actor for event in audit]


async def test_finding8_a_logout_on_one_replica_ends_the_session_on_the_other(
    jobs_schema: str,
) -> None:
    async with (
        serving(config(jobs_schema), environ=ENV) as one,
        serving(config(jobs_schema), environ=ENV) as two,
        aiohttp.ClientSession() as http,
    ):
        _, cookie = await login(http, one)
        assert 200 == await page_with(http, two, cookie)
        assert 303 == await logout_with(http, one, cookie)
        # bounded: the other replica reads the audit log within REVOCATION_POLL_S
        async with asyncio.timeout(REVOCATION_POLL_S * 5):
            while (status := await page_with(http, two, cookie)) != 303:
                await asyncio.sleep(0.1)
    assert 303 == status
