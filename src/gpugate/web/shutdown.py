"""What a request still running when the shutdown grace ends gets: an answer, never a cut.

Uvicorn cancels the requests left at the end of its graceful-shutdown timeout, and a cancelled
ASGI app gets a ``text/plain`` 500 (nothing sent yet) or a dropped connection (a response under
way). :class:`ShutdownGuard` wraps the whole app and acts first, when the replica's
:class:`~gpugate.services.readiness.Lifecycle` is ``cut``: it cancels each request still in
flight and answers it as the rest of gpugate answers a refusal or a broken stream —

* nothing sent yet: ``503`` JSON ``SHUTTING_DOWN`` with ``Retry-After`` (another replica answers);
* an SSE stream under way: a final ``event: error`` with the same error body, the way the data
  plane ends a stream its upstream broke off (the ``openai`` client raises ``APIError``);
* any other body under way: the connection is dropped, so the truncation is never silent.

Uvicorn's own cancellation stays as a backstop, a little later (``server.CUT_MARGIN_S``).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gpugate.errors import ShuttingDown
from gpugate.services.readiness import Lifecycle
from gpugate.web.errors import error_body, error_headers

log = logging.getLogger("gpugate.shutdown")

_CUT = "the shutdown grace period is over"


@dataclass(slots=True)
class Progress:
    """How far one response has got."""

    started: bool = False
    ended: bool = False
    event_stream: bool = False


class ShutdownGuard:
    """ASGI middleware: requests in flight at the cut are answered, not dropped."""

    def __init__(self, app: ASGIApp, lifecycle: Lifecycle) -> None:
        self.app = app
        self._inflight: dict[asyncio.Task[object], Progress] = {}
        self._cut: set[asyncio.Task[object]] = set()
        lifecycle.on("cut", self._cut_all)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        task = asyncio.current_task()
        assert task is not None
        progress = self.track(task)

        async def tracked(message: Message) -> None:
            if message["type"] == "http.response.start":
                progress.started = True
                progress.event_stream = any(
                    name == b"content-type" and value.startswith(b"text/event-stream")
                    for name, value in message.get("headers", ())
                )
            elif message["type"] == "http.response.body" and not message.get("more_body"):
                progress.ended = True
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except asyncio.CancelledError:
            if not self.was_cut(task) or progress.ended:
                raise
            task.uncancel()
            await answer(send, progress)
        finally:
            self.untrack(task)

    # The fast path (gpugate.web.fastpath) tracks its requests here too, without ASGI.
    def track(self, task: asyncio.Task[object]) -> Progress:
        """A request now in flight: cut at the end of the grace unless it ended."""
        progress = self._inflight[task] = Progress()
        return progress

    def untrack(self, task: asyncio.Task[object]) -> None:
        del self._inflight[task]
        self._cut.discard(task)

    def was_cut(self, task: asyncio.Task[object]) -> bool:
        """Whether ``task`` was cancelled by the cut (so its cancellation is answered)."""
        return task in self._cut

    def _cut_all(self) -> None:
        left = [task for task, progress in self._inflight.items() if not progress.ended]
        if left:
            log.warning("%s: answering the %d request(s) still in flight", _CUT, len(left))
        for task in left:
            self._cut.add(task)
            task.cancel(_CUT)

    def __repr__(self) -> str:
        return f"<ShutdownGuard inflight={len(self._inflight)}>"


async def answer(send: Send, progress: Progress) -> None:
    """The answer of a request cut in flight (see the module docstring)."""
    exc = ShuttingDown(retry_after_s=1)
    if not progress.started:
        headers = [(b"content-type", b"application/json")]
        headers += [(k.encode(), v.encode()) for k, v in error_headers(exc).items()]
        await send({"type": "http.response.start", "status": 503, "headers": headers})
        await send({"type": "http.response.body", "body": error_body(exc), "more_body": False})
    elif progress.event_stream:
        event = b"event: error\ndata: " + error_body(exc) + b"\n\n"
        await send({"type": "http.response.body", "body": event, "more_body": False})
    else:
        raise ConnectionAbortedError(_CUT)  # uvicorn closes the connection: not a silent cut
