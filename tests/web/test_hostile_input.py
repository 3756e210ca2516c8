"""Input that once answered 500 or a retryable 503 is a 400 naming what is wrong, on both store
backends alike, and changes nothing (issue 14 defects 4, 7, 8; issue 15 finding 8)."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from itertools import pairwise
from typing import Any

import aiohttp
import pytest

from gpugate.config.untrusted import MAX_YAML_NODES
from harness import RunningGateway, make_config, serving, upstream

ADMIN = "admin-token"
WORKER = "worker-secret"
ENVIRON = {"GPUGATE_ADMIN_TOKEN": ADMIN, "HOME_SECRET": WORKER}
AS_ADMIN = {"Authorization": f"Bearer {ADMIN}"}
DEEP_JSON = "[" * 10_000 + "]" * 10_000


@pytest.fixture
async def gw(dsn: str) -> AsyncIterator[RunningGateway]:
    """A gateway whose only upstream is never reached, with a push runtime ``home``."""
    home = {
        "id": "home",
        "kind": "push",
        "models": ["m"],
        # bearer: the worker routes check bodies after authenticating, and a bearer secret
        # keeps these hand-made requests plain (the signed protocol: tests/security)
        "push": {"url": "http://127.0.0.1:9/calls", "secret_env": "HOME_SECRET", "auth": "bearer"},
    }
    config = make_config(
        dsn,
        [upstream("u", ["http://127.0.0.1:9"], ["m"])],
        runtimes=[{"id": "local", "kind": "upstream"}, home],
        fallback_chain=["local", "home"],
    )
    async with serving(config, environ=ENVIRON, run_job_loops=False) as running:
        yield running


async def answer(
    http: aiohttp.ClientSession,
    method: str,
    url: str,
    body: str | bytes | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, dict[str, Any]]:
    """The status and the JSON body of one request on a fresh connection."""
    headers = {"Connection": "close", "Content-Type": "application/json", **(headers or {})}
    async with http.request(method, url, data=body, headers=headers) as resp:
        return resp.status, await resp.json(content_type=None)


def alias_bomb() -> str:
    """Nine levels of nine aliases of the level before: 9 ** 9 values in 300 bytes."""
    lines = ["a: &a [" + ", ".join(["lol"] * 9) + "]"]
    lines += [f"{n}: &{n} [" + ", ".join([f"*{b}"] * 9) + "]" for b, n in pairwise("abcdefghi")]
    return "\n".join(lines) + "\n"


async def test_defect_4_an_alias_bomb_import_is_refused_at_once_and_changes_nothing(
    gw: RunningGateway, http: aiohttp.ClientSession
) -> None:
    headers = {**AS_ADMIN, "Content-Type": "application/yaml"}
    before = gw.gateway.config_version

    status, body = await answer(http, "PUT", gw.url + "/admin/config", alias_bomb(), headers)

    assert (422, "CONFIG_INVALID") == (status, body["error"]["code"])
    expected = f"the document holds more than {MAX_YAML_NODES} values, its aliases expanded"
    assert [{"path": "", "message": expected, "line": 6}] == body["error"]["problems"]
    assert before == gw.gateway.config_version


@pytest.mark.parametrize(
    ("media", "document"),
    [("application/json", DEEP_JSON), ("application/yaml", "upstreams: " + DEEP_JSON)],
)
async def test_defect_7_a_deeply_nested_config_import_is_a_config_problem_not_a_500(
    gw: RunningGateway, http: aiohttp.ClientSession, media: str, document: str
) -> None:
    headers = {**AS_ADMIN, "Content-Type": media}

    status, body = await answer(http, "PUT", gw.url + "/admin/config", document, headers)

    assert (422, "CONFIG_INVALID") == (status, body["error"]["code"])
    assert 1 == len(body["error"]["problems"])


@pytest.mark.parametrize(
    ("method", "path", "headers"),
    [
        ("POST", "/v1/jobs", {}),
        ("POST", "/v1/jobs?wait=0", {}),
        ("POST", "/v1/batches", {}),
        ("POST", "/v1/chat/completions", {}),
        ("POST", "/v1/embeddings", {}),
        ("POST", "/admin/runtimes/home/disable", AS_ADMIN),
        ("PATCH", "/v1/jobs/some-job", {"Authorization": f"Bearer {WORKER}"}),
    ],
)
async def test_defect_7_json_nested_ten_thousand_deep_is_400_on_every_json_route(
    gw: RunningGateway, http: aiohttp.ClientSession, method: str, path: str, headers: dict[str, str]
) -> None:
    status, body = await answer(http, method, gw.url + path, DEEP_JSON, headers)

    assert (400, "BAD_REQUEST") == (status, body["error"]["code"])
    assert "nested" in body["error"]["message"]


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ('"a\\u0000b"', "text holds a NUL character (\\u0000)"),
        ('"a\\ud800b"', "text holds a lone UTF-16 surrogate (not a character)"),
    ],
)
async def test_defect_8_text_no_store_can_hold_in_a_job_input_is_400_and_makes_no_job(
    gw: RunningGateway, http: aiohttp.ClientSession, text: str, problem: str
) -> None:
    body = f'{{"model": "m", "input": {{"messages": [{{"role": "user", "content": {text}}}]}}}}'

    status, error = await answer(http, "POST", gw.url + "/v1/jobs", body)

    assert (400, f"input.messages[0].content: {problem}") == (status, error["error"]["message"])
    assert [] == (await gw.gateway.store.list_jobs(limit=10)).jobs


@pytest.mark.parametrize("text", ['"a\\u0000b"', '"a\\udc00b"'])
async def test_defect_8_text_no_store_can_hold_in_a_disable_reason_is_400_and_changes_nothing(
    gw: RunningGateway, http: aiohttp.ClientSession, text: str
) -> None:
    url = gw.url + "/admin/runtimes/home/disable"

    status, error = await answer(http, "POST", url, f'{{"reason": {text}}}', AS_ADMIN)

    assert (400, "BAD_REQUEST") == (status, error["error"]["code"])
    assert error["error"]["message"].startswith("reason: text holds ")
    assert {} == await gw.gateway.store.runtime_states()


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity", "1e999"])
async def test_finding_8_non_finite_numbers_in_a_job_input_are_400(
    gw: RunningGateway, http: aiohttp.ClientSession, number: str
) -> None:
    body = f'{{"model": "m", "input": {{"temperature": {number}}}}}'

    status, error = await answer(http, "POST", gw.url + "/v1/jobs", body)

    assert (400, "BAD_REQUEST") == (status, error["error"]["code"])
    assert error["error"]["message"].startswith("input.temperature: expected a finite number")


async def test_finding_8_a_workers_nan_cost_is_400_before_it_can_complete_the_job(
    gw: RunningGateway, http: aiohttp.ClientSession
) -> None:
    headers = {"Authorization": f"Bearer {WORKER}", "X-Lease-Token": "t"}
    url = gw.url + "/v1/jobs/some-job"

    status, error = await answer(http, "PATCH", url, '{"result": {}, "cost_cents": NaN}', headers)

    assert (400, "cost_cents: expected a finite number, got nan") == (
        status,
        error["error"]["message"],
    )


@pytest.mark.parametrize(
    "path",
    [
        "/v1/jobs/a%00b",
        "/v1/jobs/a%00b/events",
        "/v1/files/file-%00",
        "/v1/files/file-%00/content",
        "/v1/batches/batch_%00",
        "/v1/jobs?runner=a%00b",
        "/v1/jobs?cursor=a%00b",
        "/admin/audit?subject=a%00b",
        "/admin/audit?action=a%00b",
        "/admin/runtimes/home%00",
    ],
)
async def test_defect_8_a_nul_in_a_path_or_a_filter_is_400_naming_it_on_both_backends(
    gw: RunningGateway, http: aiohttp.ClientSession, path: str
) -> None:
    status, error = await answer(http, "GET", gw.url + path, headers=AS_ADMIN)

    assert (400, "BAD_REQUEST") == (status, error["error"]["code"])
    assert "expected text without control characters" in error["error"]["message"]


@pytest.mark.parametrize(
    ("key", "problem"),
    [
        ("k" * 3000, "expected at most 255 characters, got 3000"),
        ("k" * 256, "expected at most 255 characters, got 256"),
        ("", "expected a non-empty string"),
        ("a\tb", "expected text without control characters"),
    ],
)
async def test_defect_8_and_finding_8_an_idempotency_key_that_is_empty_or_too_long_is_400(
    gw: RunningGateway, http: aiohttp.ClientSession, key: str, problem: str
) -> None:
    headers = {"Idempotency-Key": key}

    status, error = await answer(
        http, "POST", gw.url + "/v1/jobs", '{"model": "m", "input": {}}', headers
    )

    assert (400, "BAD_REQUEST") == (status, error["error"]["code"])
    assert error["error"]["message"].startswith(f"Idempotency-Key: {problem}")
    assert [] == (await gw.gateway.store.list_jobs(limit=10)).jobs


async def test_a_255_character_idempotency_key_is_kept_on_both_backends(
    gw: RunningGateway, http: aiohttp.ClientSession
) -> None:
    headers = {"Idempotency-Key": "k" * 255}
    body = '{"model": "m", "input": {}}'

    first, job = await answer(http, "POST", gw.url + "/v1/jobs", body, headers)
    again, same = await answer(http, "POST", gw.url + "/v1/jobs", body, headers)

    assert (202, 200, job["slug"]) == (first, again, same["slug"])


@pytest.fixture
async def console(gw: RunningGateway, http: aiohttp.ClientSession) -> tuple[dict[str, str], str]:
    """A console session's cookie header and its CSRF token."""
    login = {"token": ADMIN}
    async with http.post(gw.url + "/console/login", data=login, allow_redirects=False) as resp:
        cookie = {"Cookie": f"gpugate_console={resp.cookies['gpugate_console'].value}"}
    async with http.get(gw.url + "/console/runtimes", headers=cookie) as resp:
        found = re.search(r'name="csrf" value="([^"]+)"', await resp.text())
    assert found is not None
    return cookie, found.group(1)


@pytest.mark.parametrize(
    "path",
    ["/console/jobs?runner=a%00b", "/console/audit?subject=a%00b", "/console/jobs/a%00b"],
)
async def test_defect_8_a_nul_in_a_console_filter_or_slug_is_a_400_page_on_both_backends(
    gw: RunningGateway,
    http: aiohttp.ClientSession,
    console: tuple[dict[str, str], str],
    path: str,
) -> None:
    cookie, _ = console

    async with http.get(gw.url + path, headers=cookie, allow_redirects=False) as resp:
        page = await resp.text()

    assert 400 == resp.status
    assert "text holds a NUL character" in page


async def test_defect_8_a_nul_in_a_console_disable_reason_changes_nothing_on_both_backends(
    gw: RunningGateway, http: aiohttp.ClientSession, console: tuple[dict[str, str], str]
) -> None:
    cookie, csrf = console
    form = {"csrf": csrf, "reason": "a\x00b", "next": "/console/runtimes"}
    url = gw.url + "/console/runtimes/home/disable"

    async with http.post(url, headers=cookie, data=form, allow_redirects=False) as resp:
        location = resp.headers["Location"]

    assert 303 == resp.status
    assert "error=BAD_REQUEST" in location
    assert {} == await gw.gateway.store.runtime_states()


async def test_defect_4_an_alias_bomb_imported_in_the_console_is_refused_and_changes_nothing(
    gw: RunningGateway, http: aiohttp.ClientSession, console: tuple[dict[str, str], str]
) -> None:
    cookie, csrf = console
    before = gw.gateway.config_version
    form = {"csrf": csrf, "document": alias_bomb(), "next": "/console/config"}
    url = gw.url + "/console/config/import"

    async with http.post(url, headers=cookie, data=form, allow_redirects=False) as resp:
        location = resp.headers["Location"]

    assert (303, "/console/config?error=Import+refused%3A+1+problem%28s%29.") == (
        resp.status,
        location,
    )
    assert before == gw.gateway.config_version
