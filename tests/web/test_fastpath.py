"""web/fastpath: the OpenAI routes served by the HTTP protocol itself (issue #21 phase 2).

Raw sockets against a real gateway on loopback, in front of real fake model servers: what the
protocol does with keep-alive, pipelining, ``Expect: 100-continue``, malformed requests, a
connection that goes from the fast path to Starlette and back, a client that leaves while its
request is queued or streamed, and the shutdown's cut. The rest of the suite runs on the same
path (it is ``gpugate serve``'s default); ``GPUGATE_FASTPATH=0`` is the ASGI path it replaces.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
import uvicorn

from gpugate import server
from gpugate.fleet import ModelServer, ServerBehaviour
from gpugate.web import fastpath
from gpugate.web.fastpath import FastCycle
from harness import (
    RunningGateway,
    connection,
    eventually,
    make_config,
    model_servers,
    serving,
    upstream,
)


@dataclass(frozen=True)
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
def fast_requests(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The paths the fast path served (so a test knows which path answered)."""
    served: list[str] = []
    run = FastCycle.run_asgi

    async def counted(self: FastCycle, app: object) -> None:
        served.append(self.path)
        await run(self, app)

    monkeypatch.setattr(FastCycle, "run_asgi", counted)
    return served


@contextlib.asynccontextmanager
async def gateway(
    sqlite_dsn: str, behaviour: ServerBehaviour | None = None, **upstream_extra: Any
) -> AsyncIterator[tuple[RunningGateway, ModelServer]]:
    async with model_servers(("u", ["m"]), behaviour=behaviour) as (server,):
        config = make_config(sqlite_dsn, [upstream("u", [server.url], ["m"], **upstream_extra)])
        async with serving(config) as gw:
            yield gw, server


def post(path: str, doc: object, *, extra: bytes = b"") -> bytes:
    body = json.dumps(doc).encode()
    return (
        b"POST %b HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n%b\r\n%b" % (path.encode(), len(body), extra, body)
    )


async def read_head(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
    lines = head.split("\r\n")
    headers = {}
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    return int(lines[0].split()[1]), headers


async def read_answer(reader: asyncio.StreamReader, *, within_s: float = 10.0) -> Answer:
    """One response, read by its framing (Content-Length or chunked), not to the end."""
    async with asyncio.timeout(within_s):
        status, headers = await read_head(reader)
        if "content-length" in headers:
            body = await reader.readexactly(int(headers["content-length"]))
        elif headers.get("transfer-encoding") == "chunked":
            parts = []
            while size := int((await reader.readuntil(b"\r\n"))[:-2], 16):
                parts.append(await reader.readexactly(size))
                await reader.readexactly(2)
            await reader.readexactly(2)
            body = b"".join(parts)
        else:
            body = await reader.read()
    return Answer(status, headers, body)


async def test_pipelined_requests_on_one_connection_are_answered_in_order(
    sqlite_dsn: str, fast_requests: list[str]
) -> None:
    async with gateway(sqlite_dsn) as (gw, _), connection(gw) as (reader, writer):
        writer.write(
            post("/v1/chat/completions", CHAT, extra=b"x-request-id: first\r\n")
            + post("/v1/embeddings", {"model": "m", "input": "x"}, extra=b"x-request-id: 2nd\r\n")
            + post("/v1/chat/completions", {"model": "nope"}, extra=b"x-request-id: third\r\n")
        )
        answers = [await read_answer(reader) for _ in range(3)]
    assert ["first", "2nd", "third"] == [a.headers["x-request-id"] for a in answers]
    assert [200, 200, 404] == [a.status for a in answers]
    assert "chat.completion" == answers[0].json()["object"]
    assert "list" == answers[1].json()["object"]
    assert ["/v1/chat/completions", "/v1/embeddings", "/v1/chat/completions"] == fast_requests


async def test_a_connection_goes_from_the_fast_path_to_starlette_and_back(
    sqlite_dsn: str, fast_requests: list[str]
) -> None:
    async with gateway(sqlite_dsn) as (gw, _), connection(gw) as (reader, writer):
        writer.write(post("/v1/chat/completions", CHAT) + b"GET /healthz HTTP/1.1\r\n\r\n")
        first = await read_answer(reader)
        health = await read_answer(reader)  # Starlette's, pipelined behind the fast path's
        writer.write(
            b"GET /v1/models HTTP/1.1\r\nhost: t\r\n\r\n"
            + post("/v1/completions", {"model": "m", "prompt": "hi"})
        )
        models = await read_answer(reader)
        last = await read_answer(reader)
    assert [200, 200, 200, 200] == [a.status for a in (first, health, models, last)]
    assert ["m"] == [m["id"] for m in models.json()["data"]]
    assert ["/v1/chat/completions", "/v1/completions"] == fast_requests


async def test_expect_100_continue_is_answered_when_the_body_is_awaited(sqlite_dsn: str) -> None:
    body = json.dumps(CHAT).encode()
    async with gateway(sqlite_dsn) as (gw, _), connection(gw) as (reader, writer):
        writer.write(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: t\r\nexpect: 100-continue\r\n"
            b"content-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(body)
        )
        async with asyncio.timeout(5):
            interim = await reader.readuntil(b"\r\n\r\n")
        writer.write(body)
        answer = await read_answer(reader)
    assert b"HTTP/1.1 100 Continue\r\n\r\n" == interim
    assert 200 == answer.status


async def test_a_declared_body_over_the_limit_gets_413_without_100_continue(
    sqlite_dsn: str,
) -> None:
    async with model_servers(("u", ["m"])) as (server,):
        config = make_config(
            sqlite_dsn, [upstream("u", [server.url], ["m"])], server={"max_body_bytes": 1000}
        )
        async with serving(config) as gw, connection(gw) as (reader, writer):
            writer.write(
                b"POST /v1/chat/completions HTTP/1.1\r\nhost: t\r\nexpect: 100-continue\r\n"
                b"content-length: 5000\r\n\r\n"
            )
            answer = await read_answer(reader)
    assert 413 == answer.status
    assert "PAYLOAD_TOO_LARGE" == answer.json()["error"]["code"]
    assert str(len(answer.body)) == answer.headers["content-length"]  # whole: not chunked


async def test_a_malformed_request_gets_400_and_the_connection_closed(sqlite_dsn: str) -> None:
    async with gateway(sqlite_dsn) as (gw, _), connection(gw) as (reader, writer):
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\ncontent-length: ten\r\n\r\n")
        async with asyncio.timeout(5):
            raw = await reader.read()
    assert raw.startswith(b"HTTP/1.1 400 ")


async def test_an_error_is_one_whole_json_answer_with_the_request_id(sqlite_dsn: str) -> None:
    async with gateway(sqlite_dsn) as (gw, _), connection(gw) as (reader, writer):
        writer.write(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: t\r\ncontent-length: 5\r\n"
            b"x-request-id: abc-1\r\n\r\n{nope"
        )
        answer = await read_answer(reader)
        writer.write(post("/v1/chat/completions", CHAT))  # the connection is still good
        after = await read_answer(reader)
    assert (400, "BAD_REQUEST") == (answer.status, answer.json()["error"]["code"])
    assert "abc-1" == answer.headers["x-request-id"]
    assert "application/json" == answer.headers["content-type"]
    assert 200 == after.status


async def test_a_whole_upstream_answer_is_relayed_with_a_content_length_and_gateway_headers(
    sqlite_dsn: str,
) -> None:
    async with gateway(sqlite_dsn) as (gw, _), connection(gw) as (reader, writer):
        writer.write(post("/v1/chat/completions", CHAT))
        answer = await read_answer(reader)
    assert 200 == answer.status
    assert "transfer-encoding" not in answer.headers
    assert str(len(answer.body)) == answer.headers["content-length"]
    assert "u" == answer.headers["x-gateway-upstream"]
    assert "1" == answer.headers["x-gateway-attempts"]
    assert float(answer.headers["x-gateway-overhead-ms"]) >= 0


async def test_under_a_key_a_length_framed_answer_ends_only_once_it_is_kept(
    sqlite_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The client may retry the moment it has the answer: the retry is a replay, never 409."""
    async with gateway(sqlite_dsn) as (gw, _), connection(gw) as (reader, writer):
        idempotency = gw.gateway.idempotency
        complete = idempotency.complete

        async def slow_complete(*args: Any) -> None:
            await asyncio.sleep(0.3)  # a slow store: the write outlasts the relay
            await complete(*args)

        monkeypatch.setattr(idempotency, "complete", slow_complete)
        key = b"idempotency-key: k-1\r\n"
        writer.write(post("/v1/chat/completions", CHAT, extra=key))
        first = await read_answer(reader)
        async with connection(gw) as (other, retry):  # another connection: nothing to wait for
            retry.write(post("/v1/chat/completions", CHAT, extra=key))
            again = await read_answer(other)
    assert str(len(first.body)) == first.headers["content-length"]  # framed by length
    assert (200, "true") == (again.status, again.headers.get("idempotent-replayed"))
    assert first.body == again.body


async def test_a_client_leaving_while_queued_leaves_the_queue_at_once(sqlite_dsn: str) -> None:
    async with gateway(sqlite_dsn, ServerBehaviour(hang=True), max_inflight=1, max_queue=4) as (
        gw,
        server,
    ):
        pool = gw.gateway.registry.upstream("u").pool
        async with connection(gw) as (_, holder):
            holder.write(post("/v1/chat/completions", CHAT))
            await eventually(lambda: pool.inflight == 1, what="the first request in flight")
            async with connection(gw) as (_, waiter):
                waiter.write(post("/v1/chat/completions", CHAT))
                await eventually(lambda: pool.queued == 1, what="the second request queued")
            await eventually(lambda: pool.queued == 0, within_s=1.0, what="the waiter gone")
            assert 1 == pool.inflight
        await eventually(lambda: pool.inflight == 0, within_s=1.0, what="the slot freed")
        await eventually(lambda: server.stats.disconnects == 1, what="the upstream told")


async def test_a_client_leaving_with_a_pipelined_request_behind_frees_the_one_in_flight(
    sqlite_dsn: str,
) -> None:
    async with gateway(sqlite_dsn, ServerBehaviour(hang=True)) as (gw, _):
        pool = gw.gateway.registry.upstream("u").pool
        async with connection(gw) as (_, writer):
            writer.write(post("/v1/chat/completions", CHAT) + post("/v1/embeddings", CHAT))
            await eventually(lambda: pool.inflight == 1, what="the first request in flight")
        await eventually(lambda: pool.inflight == 0, within_s=1.0, what="the slot freed")


async def test_a_client_leaving_mid_stream_closes_the_upstream_and_frees_the_slot(
    sqlite_dsn: str,
) -> None:
    behaviour = ServerBehaviour(chunk_delay_s=0.2, chunks=50)
    async with gateway(sqlite_dsn, behaviour) as (gw, server):
        pool = gw.gateway.registry.upstream("u").pool
        async with connection(gw) as (reader, writer):
            writer.write(post("/v1/chat/completions", {**CHAT, "stream": True}))
            status, headers = await read_head(reader)
            await reader.readuntil(b"\n\n")  # the first event
            assert (200, "chunked") == (status, headers["transfer-encoding"])
            assert 1 == pool.inflight
            assert not fastpath.busy()  # a stream waiting for its next event is not work
        await eventually(lambda: pool.inflight == 0, within_s=1.0, what="the slot freed")
        await eventually(lambda: server.stats.open_streams == 0, within_s=1.0, what="closed")


async def test_a_stream_open_at_the_cut_ends_with_a_shutting_down_event(sqlite_dsn: str) -> None:
    behaviour = ServerBehaviour(chunk_delay_s=0.2, chunks=50)
    async with gateway(sqlite_dsn, behaviour) as (gw, _), connection(gw) as (reader, writer):
        writer.write(post("/v1/chat/completions", {**CHAT, "stream": True}))
        await read_head(reader)
        await reader.readuntil(b"\n\n")
        gw.gateway.lifecycle.cut()
        async with asyncio.timeout(5):
            rest = b""
            while not rest.endswith(b"0\r\n\r\n"):
                rest += await reader.read(65536)
    assert b"event: error\ndata: " in rest
    assert b'"SHUTTING_DOWN"' in rest


async def test_a_request_queued_at_the_cut_gets_503_with_retry_after(sqlite_dsn: str) -> None:
    async with gateway(sqlite_dsn, ServerBehaviour(hang=True), max_inflight=1, max_queue=4) as (
        gw,
        _,
    ):
        pool = gw.gateway.registry.upstream("u").pool
        async with connection(gw) as (_, holder), connection(gw) as (reader, waiter):
            holder.write(post("/v1/chat/completions", CHAT))
            await eventually(lambda: pool.inflight == 1, what="the first request in flight")
            waiter.write(post("/v1/chat/completions", CHAT))
            await eventually(lambda: pool.queued == 1, what="the second request queued")
            gw.gateway.lifecycle.cut()
            answer = await read_answer(reader)
    assert 503 == answer.status
    assert "SHUTTING_DOWN" == answer.json()["error"]["code"]
    assert "retry-after" in answer.headers


async def test_the_graceful_shutdown_lets_an_open_stream_finish_then_closes_it(
    sqlite_dsn: str,
) -> None:
    behaviour = ServerBehaviour(chunk_delay_s=0.05, chunks=10)
    async with model_servers(("u", ["m"]), behaviour=behaviour) as (server,):
        config = make_config(sqlite_dsn, [upstream("u", [server.url], ["m"])])
        stack = contextlib.AsyncExitStack()
        gw = await stack.enter_async_context(serving(config))
        async with connection(gw) as (reader, writer):
            writer.write(post("/v1/chat/completions", {**CHAT, "stream": True}))
            await read_head(reader)
            stopping = asyncio.create_task(stack.aclose())  # uvicorn's graceful shutdown
            async with asyncio.timeout(5):
                rest = await reader.read()  # to the end: closed once the stream is whole
            await stopping
    assert b"data: [DONE]\n\n" in rest
    assert rest.endswith(b"0\r\n\r\n")


async def test_keys_mode_is_served_on_the_fast_path_through_the_client_key_middleware(
    sqlite_dsn: str, fast_requests: list[str]
) -> None:
    admin = {"Authorization": "Bearer s3cret"}
    async with model_servers(("u", ["m"])) as (server,):
        config = make_config(
            sqlite_dsn, [upstream("u", [server.url], ["m"])], auth={"mode": "keys"}
        )
        environ = {"GPUGATE_ADMIN_TOKEN": "s3cret"}
        async with serving(config, environ=environ) as gw, aiohttp.ClientSession() as http:
            created = {"name": "app", "tenant": "t", "models": ["m"]}
            async with http.post(gw.url + "/admin/keys", json=created, headers=admin) as resp:
                secret = (await resp.json())["key"]
            async with connection(gw) as (reader, writer):
                writer.write(post("/v1/chat/completions", CHAT))
                refused = await read_answer(reader)
                key = b"authorization: Bearer %b\r\n" % secret.encode()
                writer.write(post("/v1/chat/completions", CHAT, extra=key))
                served = await read_answer(reader)
                writer.write(post("/v1/chat/completions", {"model": "other"}, extra=key))
                other = await read_answer(reader)
    assert (401, "UNAUTHORIZED") == (refused.status, refused.json()["error"]["code"])
    assert 200 == served.status
    assert (403, "MODEL_NOT_ALLOWED") == (other.status, other.json()["error"]["code"])
    assert ["/v1/chat/completions"] * 3 == fast_requests


@pytest.mark.parametrize("setting", ["0", " 0 "])
def test_gpugate_fastpath_0_turns_the_fast_path_off(setting: str) -> None:
    assert not fastpath.enabled({"GPUGATE_FASTPATH": setting})


@pytest.mark.parametrize("environ", [{}, {"GPUGATE_FASTPATH": "1"}])
def test_the_fast_path_is_on_by_default(environ: dict[str, str]) -> None:
    assert fastpath.enabled(environ)


async def test_the_fast_path_is_busy_while_a_request_waits_for_its_answer(
    sqlite_dsn: str,
) -> None:
    async with gateway(sqlite_dsn, ServerBehaviour(hang=True)) as (gw, _):
        pool = gw.gateway.registry.upstream("u").pool
        assert not fastpath.busy()
        async with connection(gw) as (_, writer):
            writer.write(post("/v1/chat/completions", CHAT))
            await eventually(lambda: pool.inflight == 1, what="the request at the upstream")
            assert fastpath.busy()
        await eventually(lambda: not fastpath.busy(), within_s=1.0, what="no longer busy")


@pytest.fixture
def keep_alive_s(monkeypatch: pytest.MonkeyPatch) -> float:
    """uvicorn's ``timeout_keep_alive`` for the gateways of this test: 0.4 s, not 30."""
    made = server._uvicorn_config  # the one place the setting is made

    def config(*args: Any, **kwargs: Any) -> uvicorn.Config:
        built = made(*args, **kwargs)
        built.timeout_keep_alive = 0.4  # type: ignore[assignment]  # uvicorn's is an int
        return built

    monkeypatch.setattr(server, "_uvicorn_config", config)
    return 0.4


async def test_a_connection_idle_for_the_keep_alive_timeout_after_an_answer_is_closed(
    sqlite_dsn: str, keep_alive_s: float
) -> None:
    async with gateway(sqlite_dsn) as (gw, _), connection(gw) as (reader, writer):
        writer.write(post("/v1/chat/completions", CHAT))
        answered = await read_answer(reader)
        idle_from = time.monotonic()
        async with asyncio.timeout(5):
            rest = await reader.read()
        idle_s = time.monotonic() - idle_from
    assert (200, b"") == (answered.status, rest)
    assert keep_alive_s - 0.05 <= idle_s < keep_alive_s + 0.5


async def test_a_request_after_an_answer_restarts_the_keep_alive_timeout(
    sqlite_dsn: str, keep_alive_s: float
) -> None:
    """The second request comes 0.25 s after the first answer, the third 0.25 s after the
    second's: 0.5 s after the first answer, past its timeout, the connection is still open."""
    async with gateway(sqlite_dsn) as (gw, _), connection(gw) as (reader, writer):
        statuses = []
        for _ in range(3):
            writer.write(post("/v1/chat/completions", CHAT))
            statuses.append((await read_answer(reader)).status)
            await asyncio.sleep(keep_alive_s * 0.6)
        async with asyncio.timeout(5):
            rest = await reader.read()
    assert ([200, 200, 200], b"") == (statuses, rest)
