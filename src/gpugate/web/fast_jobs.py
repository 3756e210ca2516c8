"""``POST /v1/jobs`` on the fast path: the jobs route's own operation, without the ASGI stack.

A job's create was a third of the event loop's time under load (issue #17 done-when 4), and most
of that was not the route but what carried it: six middlewares each wrapping ``send``, Starlette's
router matching the path against every route, its exception middlewares, uvicorn's ASGI cycle.
:class:`JobCreation` serves the request over the fast path's cycle
(:class:`~gpugate.web.fastpath.FastCycle`) by calling the very operation Starlette calls,
:data:`gpugate.web.jobs.create_job`'s :meth:`~gpugate.web.api.Endpoint.handle`, with a Starlette
``Request`` of the same scope: so the client key and its tenant (``auth.mode: keys``), the
body's limit and validation (400 naming the key path), ``Idempotency-Key`` (422
``IDEMPOTENCY_KEY_REUSED``), the OpenAPI document and every answer are the route's own, written
once. What the middlewares add is added here as the fast path adds it for the OpenAI routes: the
request id (``X-Request-Id``, set for logging and echoed), the access-log line, the security
headers and the shutdown guard (:class:`FastCycle`'s), an error as the app's exception handler
answers it.

Only a request without a query string comes here: ``?wait=`` (the synchronous front) and any
other query go through ASGI as before, as does the admin listener's. Unlike the data plane's, a
create is not cancelled when its client goes away (nor is it on ASGI): the job may be half made
(its owner stored, keys mode), so it runs to its end and only its answer is dropped.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from starlette.requests import Request

from gpugate.errors import GpugateError
from gpugate.logs import request_id
from gpugate.web.errors import error_response
from gpugate.web.jobs import create_job
from gpugate.web.requestid import HEADER as REQUEST_ID
from gpugate.web.requestid import RequestIdMiddleware, RequestIds

if TYPE_CHECKING:
    from starlette.responses import Response
    from starlette.types import ASGIApp, Message

    from gpugate.web.fastpath import FastCycle

PATH = b"/v1/jobs"


class JobCreation:
    """Serves ``POST /v1/jobs`` (no query) over a fast-path cycle; see the module docstring."""

    __slots__ = ("app", "ids")

    def __init__(self, app: ASGIApp, ids: RequestIds) -> None:
        self.app = app  # the Starlette app: a Request's ``app`` (its state holds the gateway)
        self.ids = ids

    @classmethod
    def find(cls, below_data_plane: ASGIApp) -> JobCreation | None:
        """The route's pieces under the data plane: the request-id middleware's ids and the
        app it wraps (as :func:`gpugate.web.app.create_app` builds it); None for another app."""
        if isinstance(below_data_plane, RequestIdMiddleware):
            return cls(below_data_plane.app, below_data_plane.ids)
        return None

    @staticmethod
    def serves(path: bytes, query: bytes) -> bool:
        """Whether a ``POST`` to ``path?query`` is this route's to serve."""
        return path == PATH and not query

    async def serve(self, cycle: FastCycle) -> None:
        """Answer the create; its client leaving drops the answer, not the job."""
        offered = next((v for k, v in cycle.headers if k == REQUEST_ID), None)
        rid = self.ids.choose(offered)
        token = request_id.set(rid.decode())
        try:
            status, headers, body = await asyncio.shield(self._respond(cycle))
        finally:
            request_id.reset(token)
        await cycle.answer(status, [*headers, (REQUEST_ID, rid)], body)

    async def _respond(self, cycle: FastCycle) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        limit = self.app.state.gateway.config.server.max_body_bytes  # type: ignore[attr-defined]
        request = Request(self._scope(cycle), _Body(cycle, limit))
        try:
            response: Response = await create_job.handle(request)
        except GpugateError as exc:  # as the app's exception handler answers it
            response = error_response(exc)
        return response.status_code, response.raw_headers, bytes(response.body)

    def _scope(self, cycle: FastCycle) -> dict[str, Any]:
        protocol = cycle.protocol
        return {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": cycle.http_version,
            "method": "POST",
            "scheme": protocol.scheme,
            "path": "/v1/jobs",
            "raw_path": PATH,
            "root_path": protocol.root_path,
            "query_string": b"",
            "headers": cycle.headers,
            "server": cycle.server,
            "client": protocol.client,
            "state": protocol.app_state.copy(),
            "app": self.app,
            "path_params": {},
        }

    def __repr__(self) -> str:
        return f"<JobCreation {PATH.decode()}>"


class _Body:
    """An ASGI ``receive`` over the cycle's body, read (within ``server.max_body_bytes``) only
    when the operation asks for it: after its authentication, as on ASGI."""

    __slots__ = ("cycle", "limit", "read")

    def __init__(self, cycle: FastCycle, limit: int) -> None:
        self.cycle, self.limit, self.read = cycle, limit, False

    async def __call__(self) -> Message:
        if self.read:
            return {"type": "http.disconnect"}
        self.read = True
        body = await self.cycle.read_body(None, self.limit)
        return {"type": "http.request", "body": body, "more_body": False}
