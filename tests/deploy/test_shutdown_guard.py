"""web/shutdown.ShutdownGuard: what a request still in flight at the cut gets (issue #14, defect
10). The app under it is a real ASGI app that starts its answer and then waits forever."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from starlette.types import Message, Receive, Scope, Send

from gpugate.clock import ManualClock
from gpugate.services.readiness import Lifecycle
from gpugate.web.shutdown import ShutdownGuard
from harness import eventually

SCOPE: dict[str, Any] = {"type": "http", "method": "POST", "path": "/v1/chat/completions"}


def waits_after(*messages: Message) -> Any:
    """An ASGI app that sends ``messages`` and then never finishes."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        for message in messages:
            await send(message)
        await asyncio.Event().wait()

    app.sends = len(messages)  # type: ignore[attr-defined]
    return app


def start(content_type: bytes) -> Message:
    return {
        "type": "http.response.start",
        "status": 200,
        "headers": [(b"content-type", content_type)],
    }


async def serve_until_cut(app: Any) -> tuple[list[Message], BaseException | None]:
    lifecycle = Lifecycle(ManualClock())
    guard = ShutdownGuard(app, lifecycle)
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    async def receive() -> Message:
        await asyncio.Event().wait()
        raise AssertionError  # never reached

    task = asyncio.create_task(guard(SCOPE, receive, send))
    await eventually(
        lambda: bool(guard._inflight) and len(sent) == app.sends,
        what="the app waiting after its sends",
    )
    lifecycle.cut()
    try:
        await asyncio.wait_for(task, timeout=5)
    except (ConnectionAbortedError, asyncio.CancelledError) as exc:
        return sent, exc
    return sent, None


async def test_a_request_with_nothing_sent_yet_gets_503_json_with_retry_after() -> None:
    sent, raised = await serve_until_cut(waits_after())

    started, body = sent
    headers = dict(started["headers"])
    assert (None, 503) == (raised, started["status"])
    assert (b"application/json", b"1") == (headers[b"content-type"], headers[b"retry-after"])
    assert "SHUTTING_DOWN" == json.loads(body["body"])["error"]["code"]
    assert body["more_body"] is False


async def test_an_sse_stream_under_way_ends_with_event_error() -> None:
    chunk = {"type": "http.response.body", "body": b"data: {}\n\n", "more_body": True}
    sent, raised = await serve_until_cut(waits_after(start(b"text/event-stream"), chunk))

    last = sent[-1]
    assert raised is None
    assert last["body"].startswith(b"event: error\ndata: ")
    assert "SHUTTING_DOWN" == json.loads(last["body"].split(b"data: ", 1)[1])["error"]["code"]
    assert last["more_body"] is False


async def test_any_other_body_under_way_is_cut_with_the_connection() -> None:
    chunk = {"type": "http.response.body", "body": b'{"partial": ', "more_body": True}
    sent, raised = await serve_until_cut(waits_after(start(b"application/json"), chunk))

    assert isinstance(raised, ConnectionAbortedError)
    assert 2 == len(sent)  # nothing was added that would make the truncation look whole


async def test_a_cancel_that_is_not_the_cut_passes_through() -> None:
    """A client gone away (or any other cancel) is not answered by the guard."""
    guard = ShutdownGuard(waits_after(), Lifecycle(ManualClock()))
    task = asyncio.create_task(guard(SCOPE, _never, _drop))
    await eventually(lambda: bool(guard._inflight), what="the request in flight")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert {} == guard._inflight


async def _never() -> Message:
    await asyncio.Event().wait()
    raise AssertionError


async def _drop(message: Message) -> None:
    return None
