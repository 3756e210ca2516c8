"""The ASGI application over a built :class:`~gpugate.wiring.Gateway`: routes, middleware."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp

from gpugate.errors import GpugateError
from gpugate.web import (
    admin,
    admin_config,
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
from gpugate.web.dataplane import DataPlane
from gpugate.web.errors import error_response
from gpugate.web.requestid import RequestIdMiddleware, RequestIds
from gpugate.web.response_headers import SecurityHeaders
from gpugate.web.shutdown import ShutdownGuard
from gpugate.wiring import Gateway


async def _gpugate_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, GpugateError)
    return error_response(exc)


def create_app(gateway: Gateway) -> ASGIApp:
    """The HTTP face of ``gateway``. The gateway's lifetime is the caller's (see ``wiring``)."""

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            gateway.stopping = True

    app = Starlette(
        routes=[
            *ops.routes,
            *models.routes,
            *jobs.routes,
            *worker.routes,
            *admin.routes,
            *admin_config.routes,
            *admin_runtimes.routes,
            *openapi.routes,
            *console.routes(),
            *azure_di.routes,
            *batches.routes,
        ],
        lifespan=lifespan,
        exception_handlers={GpugateError: _gpugate_error},
    )
    app.state.gateway = gateway
    if gateway.batch_runner is not None:  # batch lines record our errors as clients see them
        gateway.batch_runner.present = batches.present
    ids = RequestIds()
    served = ShutdownGuard(
        DataPlane(RequestIdMiddleware(app, ids), gateway, ids), gateway.lifecycle
    )
    return SecurityHeaders(served, behind_tls_proxy=gateway.config.server.behind_tls_proxy)
