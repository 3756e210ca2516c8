"""A fake Azure Document Intelligence resource on loopback, speaking the documented protocol.

``POST /documentintelligence/documentModels/{model}:analyze?api-version=...`` with the right
``Ocp-Apim-Subscription-Key`` → ``202``, ``Operation-Location`` (this server's own URL of the
result) and ``Retry-After``; ``GET .../analyzeResults/{id}`` → ``notStarted``, then ``running``,
then ``succeeded`` (or ``failed`` for the model ``prebuilt-fail``), one step per poll. A wrong
or missing key → ``401`` with Azure's error shape. Every request is recorded.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, Self

from aiohttp import web

FAILING_MODEL = "prebuilt-fail"
_STEPS = ("notStarted", "running")


@dataclass
class Seen:
    method: str
    path: str
    query: dict[str, str]
    key: str | None
    body: bytes


@dataclass
class _Operation:
    model: str
    polls: int = 0


@dataclass
class FakeDocumentIntelligence:
    key: str
    retry_after_s: int = 1
    seen: list[Seen] = field(default_factory=list)
    _ops: dict[str, _Operation] = field(default_factory=dict)
    _ids: itertools.count[int] = field(default_factory=itertools.count)
    _runner: web.AppRunner | None = None
    url: str = ""

    async def __aenter__(self) -> Self:
        app = web.Application()
        app.router.add_post(
            "/documentintelligence/documentModels/{model:[^/:]+}:analyze", self._analyze
        )
        app.router.add_get(
            "/documentintelligence/documentModels/{model}/analyzeResults/{rid}", self._result
        )
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        server = site._server  # the bound port of port 0
        assert server is not None
        port = server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._runner is not None
        await self._runner.cleanup()

    async def _record(self, request: web.Request) -> web.Response | None:
        self.seen.append(
            Seen(
                request.method,
                request.path,
                dict(request.query),
                request.headers.get("Ocp-Apim-Subscription-Key"),
                await request.read(),
            )
        )
        if request.headers.get("Ocp-Apim-Subscription-Key") != self.key:
            error = {
                "code": "401",
                "message": "Access denied due to invalid subscription key or wrong API "
                "endpoint. Make sure to provide a valid key for an active subscription.",
            }
            return web.json_response({"error": error}, status=401)
        return None

    async def _analyze(self, request: web.Request) -> web.Response:
        if (refused := await self._record(request)) is not None:
            return refused
        model = request.match_info["model"]
        rid = f"result-{next(self._ids)}"
        self._ops[rid] = _Operation(model)
        version = request.query.get("api-version", "")
        location = (
            f"{self.url}/documentintelligence/documentModels/{model}/analyzeResults/{rid}"
            f"?api-version={version}"
        )
        headers = {"Operation-Location": location, "Retry-After": str(self.retry_after_s)}
        return web.Response(status=202, headers=headers)

    async def _result(self, request: web.Request) -> web.Response:
        if (refused := await self._record(request)) is not None:
            return refused
        op = self._ops.get(request.match_info["rid"])
        if op is None:
            error = {"code": "NotFound", "message": "Resource not found."}
            return web.json_response({"error": error}, status=404)
        step = op.polls
        op.polls += 1
        body: dict[str, Any] = {
            "createdDateTime": "2026-07-08T10:00:00Z",
            "lastUpdatedDateTime": "2026-07-08T10:00:01Z",
        }
        if step < len(_STEPS):
            body["status"] = _STEPS[step]
            headers = {"Retry-After": str(self.retry_after_s)}
            return web.json_response(body, headers=headers)
        if op.model == FAILING_MODEL:
            body["status"] = "failed"
            body["error"] = {"code": "InternalServerError", "message": "An unexpected error."}
        else:
            body["status"] = "succeeded"
            body["analyzeResult"] = {
                "apiVersion": request.query.get("api-version", ""),
                "modelId": op.model,
                "content": "Hello, world.",
                "pages": [{"pageNumber": 1, "width": 8.5, "height": 11, "unit": "inch"}],
            }
        return web.json_response(body)
