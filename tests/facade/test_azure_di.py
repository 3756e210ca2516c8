"""The Azure Document Intelligence pass-through, against a fake DI resource on loopback."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from fake_di import FAILING_MODEL, FakeDocumentIntelligence

from harness import RunningGateway, make_config, model_servers, serving, upstream

KEY = "di-key-0123456789abcdef"
API_VERSION = "2024-11-30"
ANALYZE = "/azure-di/documentintelligence/documentModels/{model}:analyze"
PDF = b"%PDF-1.4 a tiny document"


@contextlib.asynccontextmanager
async def di_gateway(
    sqlite_dsn: str, *, di_url: str | None = None, environ: dict[str, str] | None = None
) -> AsyncIterator[tuple[RunningGateway, FakeDocumentIntelligence]]:
    async with (
        FakeDocumentIntelligence(KEY) as fake,
        model_servers(("s1", ["m1"])) as (s1,),
    ):
        config = make_config(
            sqlite_dsn,
            [
                upstream("u1", [s1.url], ["m1"]),
                upstream(
                    "azure",
                    [di_url or fake.url],
                    ["prebuilt-layout", "prebuilt-read", FAILING_MODEL],
                    kind="azure-di",
                    api_key_env="AZURE_DI_KEY",
                ),
            ],
        )
        async with serving(config, environ=environ or {"AZURE_DI_KEY": KEY}) as gw:
            yield gw, fake


async def analyze(
    http: aiohttp.ClientSession, gw: RunningGateway, model: str, **headers: str
) -> aiohttp.ClientResponse:
    url = gw.url + ANALYZE.format(model=model)
    params = {"api-version": API_VERSION}
    hdrs = {"content-type": "application/pdf", **headers}
    async with http.post(url, params=params, data=PDF, headers=hdrs) as resp:
        await resp.read()
        return resp


async def poll_until_done(http: aiohttp.ClientSession, location: str) -> list[dict[str, Any]]:
    """Every poll's body until the status is terminal (the fake advances one step per poll)."""
    bodies: list[dict[str, Any]] = []
    for _ in range(10):
        async with http.get(location) as resp:
            assert resp.status == 200
            body = await resp.json()
        bodies.append(body)
        if body["status"] in ("succeeded", "failed"):
            return bodies
    pytest.fail("the analysis never finished")


async def test_an_analyze_goes_202_then_polls_through_the_gateway_to_succeeded(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    async with di_gateway(sqlite_dsn) as (gw, fake):
        resp = await analyze(http, gw, "prebuilt-layout")
        location = resp.headers["Operation-Location"]
        assert resp.status == 202
        assert resp.headers["Retry-After"] == "1"
        assert resp.headers["X-Gateway-Upstream"] == "azure"
        assert location == (
            f"{gw.url}/azure-di/documentintelligence/documentModels/prebuilt-layout/"
            f"analyzeResults/result-0?api-version={API_VERSION}"
        )
        bodies = await poll_until_done(http, location)
    assert [b["status"] for b in bodies] == ["notStarted", "running", "succeeded"]
    assert bodies[-1]["analyzeResult"]["modelId"] == "prebuilt-layout"
    assert [(s.method, s.query, s.key) for s in fake.seen] == [
        ("POST", {"api-version": API_VERSION}, KEY),
        *[("GET", {"api-version": API_VERSION}, KEY)] * 3,
    ]
    assert fake.seen[0].body == PDF


async def test_a_failed_analysis_reaches_the_client_as_the_resource_reported_it(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    async with di_gateway(sqlite_dsn) as (gw, _):
        resp = await analyze(http, gw, FAILING_MODEL)
        bodies = await poll_until_done(http, resp.headers["Operation-Location"])
    assert bodies[-1]["status"] == "failed"
    assert bodies[-1]["error"]["code"] == "InternalServerError"


async def test_x_allow_external_false_is_refused_403_and_nothing_leaves(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    async with di_gateway(sqlite_dsn) as (gw, fake):
        url = gw.url + ANALYZE.format(model="prebuilt-layout")
        headers = {"X-Allow-External": "false"}
        async with http.post(url, data=PDF, headers=headers) as resp:
            status, body = resp.status, await resp.json()
        poll = (
            f"{gw.url}/azure-di/documentintelligence/documentModels/prebuilt-read/analyzeResults/x"
        )
        async with http.get(poll, headers=headers) as resp:
            poll_status = resp.status
    assert (status, body["error"]["code"]) == (403, "EXTERNAL_UPSTREAM_FORBIDDEN")
    assert poll_status == 403
    assert fake.seen == []


async def test_an_unknown_di_model_is_404_and_a_foreign_path_is_400(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    async with di_gateway(sqlite_dsn) as (gw, fake):
        unknown = await analyze(http, gw, "prebuilt-invoice")
        async with http.get(gw.url + "/azure-di/formrecognizer/info") as resp:
            foreign = resp.status, (await resp.json())["error"]["code"]
        async with http.get(gw.url + ANALYZE.format(model="prebuilt-read")) as resp:
            analyze_by_get = resp.status
    assert unknown.status == 404
    assert foreign == (400, "BAD_REQUEST")
    assert analyze_by_get == 400
    assert fake.seen == []


async def test_di_model_ids_are_not_models_of_the_openai_routes(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    async with di_gateway(sqlite_dsn) as (gw, fake):
        body = {"model": "prebuilt-layout", "messages": [{"role": "user", "content": "hi"}]}
        async with http.post(gw.v1 + "/chat/completions", json=body) as resp:
            chat = resp.status, (await resp.json())["error"]["code"]
        async with http.get(gw.v1 + "/models") as resp:
            listed = [m["id"] for m in (await resp.json())["data"]]
    assert chat == (404, "UNKNOWN_MODEL")
    assert listed == ["m1"]
    assert fake.seen == []


async def test_the_client_credentials_are_replaced_by_the_upstream_key(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    async with di_gateway(sqlite_dsn) as (gw, fake):
        await analyze(
            http,
            gw,
            "prebuilt-read",
            **{"Ocp-Apim-Subscription-Key": "client-guess", "Authorization": "Bearer x"},
        )
    assert [s.key for s in fake.seen] == [KEY]


async def test_the_key_never_appears_in_logs_or_error_bodies(
    tmp_path: Path, http: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    """A run that succeeds, one whose key the resource refuses, one whose resource is down."""
    caplog.set_level(logging.DEBUG)
    bodies: list[bytes] = []
    dsn = [f"sqlite:///{tmp_path / f'gpugate-{n}.db'}" for n in range(3)]
    async with di_gateway(dsn[0]) as (gw, _):
        resp = await analyze(http, gw, "prebuilt-layout")
        polled = await poll_until_done(http, resp.headers["Operation-Location"])
        bodies.extend(repr(body).encode() for body in polled)
    async with di_gateway(dsn[1], environ={"AZURE_DI_KEY": "wrong-" + KEY}) as (gw, _):
        url = gw.url + ANALYZE.format(model="prebuilt-layout")
        async with http.post(url, data=PDF) as resp:
            assert resp.status == 401  # the resource's own refusal, passed through
            bodies.append(await resp.read())
    async with di_gateway(dsn[2], di_url="http://127.0.0.1:9") as (gw, _):
        url = gw.url + ANALYZE.format(model="prebuilt-layout")
        async with http.post(url, data=PDF) as resp:
            assert resp.status == 502
            bodies.append(await resp.read())
    assert caplog.records, "nothing was logged: the test would prove nothing"
    assert KEY not in caplog.text
    assert all(KEY.encode() not in body for body in bodies)
