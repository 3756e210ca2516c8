"""The access log (issue #19): one INFO line per request on ``gpugate.access``, written when the
response ends, with the data plane's upstream, model and attempts, and the request's id."""

from __future__ import annotations

import json
import logging

import aiohttp
import pytest

from gpugate.fleet import ModelServer
from gpugate.fleet.behaviour import ServerBehaviour
from gpugate.logs import JsonFormatter
from harness import make_config, serving, upstream

CHAT = {"model": "m1", "messages": [{"role": "user", "content": "hi"}]}


def lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "gpugate.access"]


async def test_each_request_is_one_line_with_status_duration_upstream_and_request_id(
    sqlite_dsn: str, http: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    async with ModelServer(["m1"], name="a") as server:
        config = make_config(sqlite_dsn, [upstream("u1", [server.url], ["m1"])])
        async with serving(config) as gw:
            with caplog.at_level(logging.INFO, logger="gpugate.access"):
                headers = {"X-Request-Id": "req-42"}
                async with http.post(gw.v1 + "/chat/completions", json=CHAT, headers=headers):
                    pass
                async with http.get(gw.v1 + "/jobs?state=queued&limit=5"):
                    pass
                async with http.get(gw.url + "/nope"):
                    pass
                async with http.get(gw.url + "/healthz"), http.get(gw.url + "/metrics"):
                    pass
    chat, listed, missing = lines(caplog)
    assert chat.getMessage().startswith("POST /v1/chat/completions 200 ")
    assert chat.getMessage().endswith(" upstream=u1 model=m1 attempts=1")
    assert "req-42" == chat.request_id  # type: ignore[attr-defined]
    assert 0 < chat.duration_ms  # type: ignore[attr-defined]
    assert listed.getMessage().startswith("GET /v1/jobs 200 ")  # the query is not kept
    assert "state=" not in listed.getMessage()
    assert missing.getMessage().startswith("GET /nope 404 ")


async def test_a_streams_line_comes_at_its_end_with_its_whole_duration(
    sqlite_dsn: str, http: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    slow = ServerBehaviour(chunk_delay_s=0.05, chunks=4)
    async with ModelServer(["m1"], name="a", behaviour=slow) as server:
        config = make_config(sqlite_dsn, [upstream("u1", [server.url], ["m1"])])
        async with serving(config) as gw:
            with caplog.at_level(logging.INFO, logger="gpugate.access"):
                async with http.post(
                    gw.v1 + "/chat/completions", json={**CHAT, "stream": True}
                ) as resp:
                    assert [] == lines(caplog)  # headers are here, the stream is not over
                    await resp.read()
    (line,) = lines(caplog)
    assert line.duration_ms >= 4 * 50  # type: ignore[attr-defined]
    entry = json.loads(JsonFormatter().format(line))
    assert ("POST", "/v1/chat/completions", 200, "u1") == (
        entry["method"], entry["path"], entry["status"], entry["upstream"]
    )  # fmt: skip


async def test_access_log_false_writes_no_line(
    sqlite_dsn: str, http: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    async with ModelServer(["m1"], name="a") as server:
        ups = [upstream("u1", [server.url], ["m1"])]
        config = make_config(sqlite_dsn, ups, server={"access_log": False})
        async with serving(config) as gw:
            with caplog.at_level(logging.INFO, logger="gpugate.access"):
                async with http.post(gw.v1 + "/chat/completions", json=CHAT) as resp:
                    assert 200 == resp.status
    assert [] == lines(caplog)
