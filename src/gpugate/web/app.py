"""The ASGI application over a built :class:`~gpugate.wiring.Gateway`: routes, middleware."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp

from gpugate.errors import GpugateError
from gpugate.web import (
    admin,
    admin_config,
    admin_keys,
    admin_runtimes,
    azure_di,
    batches,
    console,
    jobs,
    models,
    openapi,
    ops,
    worker,
)
from gpugate.web.access_log import AccessLog
from gpugate.web.auth import ClientKeys
from gpugate.web.dataplane import DataPlane
from gpugate.web.errors import error_response, from_http_exception
from gpugate.web.requestid import RequestIdMiddleware, RequestIds
from gpugate.web.response_headers import SecurityHeaders
from gpugate.web.shutdown import ShutdownGuard
from gpugate.wiring import Gateway


async def _gpugate_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, GpugateError)
    return error_response(exc)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    response = error_response(from_http_exception(exc))
    response.headers.update(exc.headers or {})  # Allow, on a 405
    return response


def create_app(gateway: Gateway) -> ASGIApp:
    """The HTTP face of ``gateway``. The gateway's lifetime is the caller's (see ``wiring``)."""

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            gateway.lifecycle.stop()

    routes = [
        *ops.routes,
        *models.routes,
        *jobs.routes,
        *worker.routes,
        *admin.routes,
        *admin_config.routes,
        *admin_keys.routes,
        *admin_runtimes.routes,
        *console.routes(),
        *azure_di.routes,
        *batches.routes,
    ]
    app = Starlette(
        routes=[*routes, *openapi.routes(routes)],
        lifespan=lifespan,
        exception_handlers={GpugateError: _gpugate_error, HTTPException: _http_error},
    )
    app.state.gateway = gateway
    ids = RequestIds()
    served = ShutdownGuard(
        ClientKeys(DataPlane(RequestIdMiddleware(app, ids), gateway, ids), gateway, ids),
        gateway.lifecycle,
    )
    secured = SecurityHeaders(served, behind_tls_proxy=gateway.config.server.behind_tls_proxy)
    return AccessLog(secured) if gateway.config.server.access_log else secured
