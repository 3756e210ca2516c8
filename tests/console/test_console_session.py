"""The console's session: login with the admin token, a signed cookie, CSRF on every action."""

from __future__ import annotations

from console_rig import TOKEN, Console

from gpugate.web.console import session

NOW = 1_750_000_000.0


def test_a_cookie_issued_for_the_token_verifies_and_names_the_actor() -> None:
    cookie = session.issue(TOKEN, "alice", NOW)
    found = session.verify(TOKEN, cookie, NOW + 60)
    assert found is not None
    assert "console:alice" == found.actor
    assert session.csrf_ok(found, found.csrf)


def test_a_tampered_forged_expired_or_other_token_cookie_is_no_session() -> None:
    cookie = session.issue(TOKEN, "alice", NOW)
    payload, signature = cookie.split(".")
    forged = session.issue("another-token", "mallory", NOW)
    assert session.verify(TOKEN, f"{payload}x.{signature}", NOW) is None
    assert session.verify(TOKEN, forged, NOW) is None
    assert session.verify(TOKEN, cookie, NOW + session.SESSION_S + 1) is None
    assert session.verify("rotated-token", cookie, NOW) is None
    assert session.verify(TOKEN, "garbage", NOW) is None
    assert session.verify(None, cookie, NOW) is None


def test_the_csrf_token_belongs_to_one_session() -> None:
    one = session.verify(TOKEN, session.issue(TOKEN, "a", NOW), NOW)
    two = session.verify(TOKEN, session.issue(TOKEN, "a", NOW), NOW)
    assert one is not None
    assert two is not None
    assert not session.csrf_ok(one, two.csrf)
    assert not session.csrf_ok(one, None)


async def test_a_page_without_a_session_redirects_to_the_login_page(console: Console) -> None:
    status, _ = await console.page("/runtimes")
    async with console.http.get(console.url + "/runtimes", allow_redirects=False) as resp:
        location = resp.headers["Location"]
    assert (303, "/console/login?next=/console/runtimes") == (status, location)


async def test_a_page_asked_for_with_the_admin_token_as_bearer_is_served_without_a_session(
    console: Console,
) -> None:
    """DESIGN §3 lists the console under the operator plane's `Authorization: Bearer`."""
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with console.http.get(
        console.url + "/runtimes", headers=headers, allow_redirects=False
    ) as resp:
        status, text, cookies = resp.status, await resp.text(), resp.cookies
    assert (200, True, None) == (status, "<h1>Runtimes</h1>" in text, cookies.get(session.COOKIE))


async def test_a_page_asked_for_with_a_wrong_bearer_token_is_401_not_the_login_page(
    console: Console,
) -> None:
    headers = {"Authorization": "Bearer not-the-token"}
    async with console.http.get(console.url, headers=headers, allow_redirects=False) as resp:
        status, text = resp.status, await resp.text()
    assert (401, True) == (status, "UNAUTHORIZED" in text)


async def test_an_action_with_the_bearer_token_but_no_session_is_still_refused(
    console: Console,
) -> None:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with console.http.post(
        console.url + "/logout", headers=headers, allow_redirects=False
    ) as resp:
        assert 401 == resp.status


async def test_a_live_fragment_without_a_session_is_401_so_the_page_goes_to_login(
    console: Console,
) -> None:
    status, _ = await console.page("/runtimes?fragment=1")
    assert 401 == status


async def test_login_sets_an_httponly_samesite_strict_cookie_scoped_to_the_console(
    console: Console,
) -> None:
    resp = await console.login()
    cookie = resp.cookies[session.COOKIE]
    assert (303, "/console") == (resp.status, resp.headers["Location"])
    assert cookie["httponly"]
    assert "/console" == cookie["path"]
    assert "strict" == cookie["samesite"].lower()
    status, text = await console.page()
    assert 200 == status
    assert "console:alice" in text


async def test_a_wrong_token_is_refused_with_a_message_and_no_cookie(console: Console) -> None:
    resp = await console.login(token="wrong")
    assert 401 == resp.status
    assert session.COOKIE not in resp.cookies
    status, _ = await console.page()
    assert 303 == status


async def test_an_action_without_the_csrf_token_is_403_csrf_rejected_and_changes_nothing(
    console: Console,
) -> None:
    await console.login()
    status, _, body = await console.post("/runtimes/local/drain", csrf=False)
    wrong, _, _ = await console.post("/runtimes/local/drain", {"csrf": "0" * 64}, csrf=False)
    assert (403, 403) == (status, wrong)
    assert '"CSRF_REJECTED"' in body
    assert {} == console.gw.gateway.runtime_ops.states


async def test_an_action_without_a_session_is_401(console: Console) -> None:
    async with console.http.post(
        console.url + "/runtimes/local/drain", data={"csrf": "x"}, allow_redirects=False
    ) as resp:
        assert 401 == resp.status


async def test_logout_ends_the_session_in_the_browser(console: Console) -> None:
    await console.login()
    status, location, _ = await console.post("/logout")
    assert (303, "/console/login") == (status, location)
    page_status, _ = await console.page()
    assert 303 == page_status
