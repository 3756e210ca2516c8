"""Operational routes: liveness, readiness, metrics."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gpugate import __version__
from gpugate.wiring import Gateway


def _gateway(request: Request) -> Gateway:
    gateway: Gateway = request.app.state.gateway
    return gateway


async def healthz(request: Request) -> Response:
    """Alive: the process answers. Says nothing about the store or the fleet."""
    return JSONResponse({"status": "ok", "version": __version__})


async def readyz(request: Request) -> Response:
    """Ready to take traffic: every check passes (store reachable, config loaded, not stopping)."""
    readiness = await _gateway(request).readiness()
    return JSONResponse(readiness.as_json(), status_code=200 if readiness.ready else 503)


async def metrics(request: Request) -> Response:
    """Prometheus exposition of the gateway's own registry."""
    registry = _gateway(request).metrics
    return Response(registry.render(), media_type=registry.content_type)


routes = [
    Route("/healthz", healthz, methods=["GET"]),
    Route("/readyz", readyz, methods=["GET"]),
    Route("/metrics", metrics, methods=["GET"]),
]
