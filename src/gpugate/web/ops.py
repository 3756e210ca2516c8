"""Operational routes: liveness, readiness, metrics."""

from __future__ import annotations

from starlette.responses import Response

from gpugate import __version__
from gpugate.web.api import operation, route
from gpugate.web.schemas.operation import Answer, Security
from gpugate.web.schemas.ops import Health, Readiness
from gpugate.wiring import Gateway

TAGS = ("operations",)


@operation(
    Security.NONE,
    tags=TAGS,
    responses={200: Answer("alive", Health)},
    uses_store=False,
)
async def healthz() -> Health:
    """Alive: the process answers. Says nothing about the store or the fleet."""
    return Health(status="ok", version=__version__)


@operation(
    Security.NONE,
    tags=TAGS,
    responses={
        200: Answer("every check passes", Readiness),
        503: Answer("a check fails: not ready for traffic", Readiness),
    },
    uses_store=False,
)
async def readyz(gateway: Gateway) -> Response:
    """Ready to take traffic: every check passes (store reachable, config loaded, not stopping)."""
    readiness = await gateway.readiness()
    view = Readiness.of(readiness.as_json())
    return Response(view.to_bytes(), 200 if readiness.ready else 503, media_type="application/json")


@operation(
    Security.NONE,
    tags=TAGS,
    responses={
        200: Answer(
            "the exposition (families prefixed gateway_)",
            media="text/plain",
            schema={"type": "string"},
        )
    },
    uses_store=False,
)
async def metrics(gateway: Gateway) -> Response:
    """Prometheus exposition of the gateway's own registry."""
    registry = gateway.metrics
    return Response(await registry.exposition(), media_type=registry.content_type)


routes = [
    route("/healthz", healthz, "GET"),
    route("/readyz", readyz, "GET"),
    route("/metrics", metrics, "GET"),
]
