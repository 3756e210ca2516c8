"""Liveness, readiness, metrics, request ids and structured logs."""

from __future__ import annotations

import json
import logging

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpugate.logs import configure_logging, request_id
from harness import make_config, model_servers, serving, upstream

UPSTREAM = [upstream("a", ["http://127.0.0.1:9"], ["m"])]


async def test_healthz_says_alive(sqlite_dsn: str, http: aiohttp.ClientSession) -> None:
    async with (
        serving(make_config(sqlite_dsn, UPSTREAM)) as gw,
        http.get(gw.url + "/healthz") as resp,
    ):
        assert 200 == resp.status
        assert "ok" == (await resp.json())["status"]


async def test_readyz_lists_each_check_and_is_200_when_all_pass(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    async with (
        serving(make_config(sqlite_dsn, UPSTREAM)) as gw,
        http.get(gw.url + "/readyz") as resp,
    ):
        body = await resp.json()
    assert 200 == resp.status
    assert {"ready": True} == {"ready": body["ready"]}
    assert ["store", "config", "lifecycle", "loops"] == [c["name"] for c in body["checks"]]
    assert all(c["ok"] for c in body["checks"])
    assert "version 1 loaded" == body["checks"][1]["detail"]


async def test_readyz_is_503_and_names_the_store_when_the_store_is_gone(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    async with serving(make_config(sqlite_dsn, UPSTREAM)) as gw:
        await gw.gateway.store.close()
        async with http.get(gw.url + "/readyz") as resp:
            body = await resp.json()
    assert 503 == resp.status
    failed = [c["name"] for c in body["checks"] if not c["ok"]]
    assert ["store"] == failed


async def test_metrics_expose_the_gateway_families_in_prometheus_format(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    async with (
        serving(make_config(sqlite_dsn, UPSTREAM)) as gw,
        http.get(gw.url + "/metrics") as resp,
    ):
        text = await resp.text()
    names = {family.name for family in text_string_to_metric_families(text)}
    expected = {
        "gateway_requests",
        "gateway_request_duration_seconds",
        "gateway_overhead_seconds",
        "gateway_upstream_inflight",
        "gateway_queue_depth",
        "gateway_config_version",
    }
    assert expected <= names


async def test_a_request_id_is_echoed_or_made_up_unique(
    sqlite_dsn: str, http: aiohttp.ClientSession
) -> None:
    async with model_servers(("u", ["m"])) as (server,):
        config = make_config(sqlite_dsn, [upstream("u", [server.url], ["m"])])
        async with serving(config) as gw:
            async with http.get(gw.url + "/healthz", headers={"X-Request-Id": "abc-123"}) as resp:
                assert "abc-123" == resp.headers["X-Request-Id"]
            made_up = []
            for url in (gw.url + "/healthz", gw.url + "/healthz", gw.v1 + "/chat/completions"):
                body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
                async with http.post(url, json=body) if "chat" in url else http.get(url) as resp:
                    made_up.append(resp.headers["X-Request-Id"])
            body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
            headers = {"X-Request-Id": "rid-9"}
            async with http.post(gw.v1 + "/chat/completions", json=body, headers=headers) as resp:
                assert "rid-9" == resp.headers["X-Request-Id"]
    assert 3 == len(set(made_up))
    assert all(made_up)


def test_json_logs_are_one_object_per_line_with_the_request_id(
    capsys: pytest.CaptureFixture[str],
) -> None:
    configure_logging("json")
    token = request_id.set("rid-7")
    try:
        logging.getLogger("gpugate.proxy").info("hello %s", "you", extra={"upstream": "a"})
    finally:
        request_id.reset(token)
    lines = capsys.readouterr().err.strip().splitlines()
    entry = json.loads(lines[-1])
    expected = {
        "level": "info",
        "logger": "gpugate.proxy",
        "msg": "hello you",
        "request_id": "rid-7",
        "upstream": "a",
    }
    assert expected == {k: entry[k] for k in expected}


@pytest.fixture(autouse=True)
def _restore_logging() -> object:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
