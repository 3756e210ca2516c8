"""The operator plane's JSON API (``/admin/...``), behind the admin token.

Every route requires ``Authorization: Bearer <admin token>``, compared in constant time. Without
an admin token configured (``admin_token_env`` unset or empty) the admin API refuses everything.
A client that offers wrong tokens too often is refused for a while (429 ``TOO_MANY_ATTEMPTS``,
the console login shares the same throttle: :func:`throttled_match`).
"""

from __future__ import annotations

import hmac
import math
import re
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gpugate.core import picking
from gpugate.core.gpu.health import gpu_key_for
from gpugate.core.registry import UpstreamState
from gpugate.core.throttle import client_key
from gpugate.errors import BadRequest, TooManyAttempts, Unauthorized
from gpugate.store import AuditEvent
from gpugate.wiring import Gateway

Handler = Callable[[Request, Gateway], Awaitable[Response]]

ACTOR_HEADER = "x-gpugate-actor"
_ACTOR_NAME = re.compile(r"[A-Za-z0-9._@-]{1,64}")


def valid_actor_name(name: str) -> bool:
    """Whether ``name`` may name an operator in the audit log (``admin:<name>``)."""
    return _ACTOR_NAME.fullmatch(name) is not None


def token_matches(offered: str, token: str) -> bool:
    """Whether ``offered`` is the admin ``token``, compared in constant time."""
    return hmac.compare_digest(offered.encode(), token.encode())


def throttled_match(request: Request, gateway: Gateway, offered: str, token: str) -> bool:
    """Whether ``offered`` is the admin ``token``; :class:`TooManyAttempts` first when this
    client has offered wrong ones too often (issue #15 finding 8: no brute force of the token
    through the console or the admin API)."""
    throttle = gateway.login_throttle
    key = client_key(request.client.host if request.client is not None else None)
    now = gateway.clock.monotonic()
    wait = throttle.retry_after(key, now)
    if wait is not None:
        raise TooManyAttempts(
            f"too many wrong admin tokens from this address; try again in {math.ceil(wait)} s",
            retry_after_s=wait,
        )
    if token_matches(offered, token):
        throttle.succeeded(key)
        return True
    throttle.failed(key, now)
    return False


def admin_actor(request: Request) -> str:
    """Who acts, for the audit log: ``admin``, or ``admin:<name>`` from ``X-Gpugate-Actor``."""
    name = request.headers.get(ACTOR_HEADER)
    if name is None:
        return "admin"
    if not valid_actor_name(name):
        raise BadRequest("X-Gpugate-Actor must be 1-64 letters, digits, '.', '_', '@' or '-'")
    return f"admin:{name}"


def _authorize(request: Request, gateway: Gateway) -> None:
    token = gateway.admin_token
    if token is None:
        raise Unauthorized(
            "the admin API is disabled: no admin token is configured (admin_token_env)"
        )
    scheme, _, offered = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not offered:
        raise Unauthorized("missing or wrong admin token")
    if not throttled_match(request, gateway, offered, token):
        raise Unauthorized("missing or wrong admin token")


def admin(handler: Handler) -> Callable[[Request], Awaitable[Response]]:
    """An admin route: authorize first, then hand the handler its gateway."""

    async def endpoint(request: Request) -> Response:
        gateway: Gateway = request.app.state.gateway
        _authorize(request, gateway)
        return await handler(request, gateway)

    endpoint.__name__ = handler.__name__
    endpoint.__doc__ = handler.__doc__
    return endpoint


def upstream_view(upstream: UpstreamState, gateway: Gateway) -> dict[str, Any]:
    """One upstream as operators see it: endpoints, load, rotation."""
    now = gateway.clock.monotonic()
    pool = upstream.pool
    return {
        "id": upstream.id,
        "models": list(upstream.config.models),
        "gpu_ids": list(upstream.config.gpu_ids),
        "external": upstream.config.external,
        "out_of_rotation": gateway.registry.out_of_rotation(upstream),
        "inflight": pool.inflight,
        "max_inflight": pool.max_inflight,
        "queued": {cls.value: n for cls, n in pool.queued_by_class().items()},
        "endpoints": [
            {
                "url": ep.url,
                "health": str(picking.health(ep, now)),
                "outstanding": ep.outstanding,
                "latency_ms": None if ep.latency_ewma_s is None else ep.latency_ewma_s * 1000,
                "ejections": ep.ejections,
            }
            for ep in upstream.endpoints
        ],
    }


@admin
async def list_upstreams(request: Request, gateway: Gateway) -> Response:
    """Every upstream with its endpoints' health, load and rotation."""
    return JSONResponse(
        {"upstreams": [upstream_view(u, gateway) for u in gateway.registry.upstreams()]}
    )


def gpus_view(gateway: Gateway) -> dict[str, Any]:
    """Every GPU row (readings, verdict, reasons, mapped upstreams) and each exporter's state."""
    monitor = gateway.monitor
    if monitor is None:
        return {"dormant": True, "gpus": [], "exporters": []}
    exporters = [
        {
            "url": e.url,
            "host": e.host,
            "scrapes": e.scrapes,
            "failures": e.failures,
            "last_error": e.last_error,
            "seconds_since_success": None
            if e.last_success is None
            else gateway.clock.monotonic() - e.last_success,
        }
        for e in monitor.exporters
    ]
    gpus = monitor.snapshot(gateway.clock.now())
    return {"dormant": False, "gpus": gpus, "exporters": exporters}


async def clear_gpu_fault(gateway: Gateway, raw: str, actor: str) -> list[str]:
    """Clear a GPU's held fault (``0``, or ``host/0``) at once, audited; returns the rows."""
    gpu_id: int | str = int(raw) if raw.isdigit() else raw
    try:
        gpu_key_for(gpu_id)
    except ValueError as exc:
        raise BadRequest(str(exc)) from exc
    if gateway.monitor is None:
        raise BadRequest("gpu_health is dormant: there is no GPU state to clear")
    cleared = gateway.monitor.clear(gpu_id)
    await gateway.store.append_audit(
        AuditEvent(actor, "gpu.cleared", f"gpu:{raw}", {"rows": cleared})
    )
    return cleared


@admin
async def list_gpus(request: Request, gateway: Gateway) -> Response:
    """Every GPU row: readings, verdict, reasons, mapped upstreams; and each exporter's state."""
    return JSONResponse(gpus_view(gateway))


@admin
async def clear_gpu(request: Request, gateway: Gateway) -> Response:
    """Clear a GPU's held fault (``0``, or ``host/0`` with several exporters); audited."""
    raw: str = request.path_params["gpu"]
    cleared = await clear_gpu_fault(gateway, raw, admin_actor(request))
    return JSONResponse({"gpu": raw, "cleared": cleared})


routes = [
    Route("/admin/upstreams", list_upstreams, methods=["GET"]),
    Route("/admin/gpus", list_gpus, methods=["GET"]),
    Route("/admin/gpus/{gpu:path}/clear", clear_gpu, methods=["POST"]),
]
