"""The operator plane's JSON API (``/admin/...``), behind the admin token: upstreams and GPUs.

Every route requires ``Authorization: Bearer <admin token>``, compared in constant time
(:func:`gpugate.web.api.authorize_admin`). Without an admin token configured
(``admin_token_env`` unset or empty) the admin API refuses everything. A client that offers
wrong tokens too often is refused for a while (429 ``TOO_MANY_ATTEMPTS``; the console login
shares the same throttle: :func:`~gpugate.web.api.throttled_match`).
"""

from __future__ import annotations

from functools import partial
from typing import Any

from gpugate.core import picking
from gpugate.core.gpu.health import parse_gpu_id
from gpugate.core.registry import UpstreamState
from gpugate.errors import BadRequest
from gpugate.services.gpu_monitor import CLEARED
from gpugate.store import AuditEvent
from gpugate.web.api import operation, route, throttled_match
from gpugate.web.schemas.admin import (
    AdminHeaders,
    EndpointView,
    ExporterView,
    GpuCleared,
    GpuPath,
    GpuRow,
    GpusView,
    UpstreamList,
    UpstreamView,
    valid_actor_name,
)
from gpugate.web.schemas.operation import Answer, Security
from gpugate.wiring import Gateway

__all__ = ["clear_gpu_fault", "gpus_view", "routes", "upstream_view"]
__all__ += ["throttled_match", "valid_actor_name"]  # the console's login checks them the same way

TAGS = ("admin",)
admin = partial(operation, Security.ADMIN, tags=TAGS)  # every operation here


def upstream_state(upstream: UpstreamState, gateway: Gateway) -> UpstreamView:
    """One upstream as operators see it: endpoints, load, rotation."""
    now = gateway.clock.monotonic()
    pool = upstream.pool
    return UpstreamView(
        id=upstream.id,
        models=list(upstream.config.models),
        gpu_ids=list(upstream.config.gpu_ids),
        external=upstream.config.external,
        out_of_rotation=gateway.registry.out_of_rotation(upstream),
        inflight=pool.inflight,
        max_inflight=pool.max_inflight,
        queued={cls.value: n for cls, n in pool.queued_by_class().items()},
        endpoints=[
            EndpointView(
                url=ep.url,
                health=str(picking.health(ep, now)),
                outstanding=ep.outstanding,
                latency_ms=None if ep.latency_ewma_s is None else ep.latency_ewma_s * 1000,
                ejections=ep.ejections,
            )
            for ep in upstream.endpoints
        ],
    )


def upstream_view(upstream: UpstreamState, gateway: Gateway) -> dict[str, Any]:
    """:func:`upstream_state` as JSON data, for the console's pages."""
    return upstream_state(upstream, gateway).as_json()


def gpus_state(gateway: Gateway) -> GpusView:
    """Every GPU row (readings, verdict, reasons, mapped upstreams) and each exporter's state."""
    monitor = gateway.monitor
    if monitor is None:
        return GpusView(dormant=True, gpus=[], exporters=[])
    now = gateway.clock.monotonic()
    exporters = [
        ExporterView(
            url=e.url,
            host=e.host,
            scrapes=e.scrapes,
            failures=e.failures,
            last_error=e.last_error,
            seconds_since_success=None if e.last_success is None else now - e.last_success,
        )
        for e in monitor.exporters
    ]
    gpus = [GpuRow.of(row) for row in monitor.snapshot(gateway.clock.now())]
    return GpusView(dormant=False, gpus=gpus, exporters=exporters)


def gpus_view(gateway: Gateway) -> dict[str, Any]:
    """:func:`gpus_state` as JSON data, for the console's pages."""
    return gpus_state(gateway).as_json()


async def clear_gpu_fault(gateway: Gateway, raw: str, actor: str) -> list[str]:
    """Clear a GPU's held fault (``0``, or ``host/0``) at once, audited; returns the rows."""
    try:
        gpu_id = parse_gpu_id(raw)
    except ValueError as exc:
        raise BadRequest(str(exc)) from exc
    if gateway.monitor is None:
        raise BadRequest("gpu_health is dormant: there is no GPU state to clear")
    cleared = gateway.monitor.clear(gpu_id)
    await gateway.store.append_audit(AuditEvent(actor, CLEARED, f"gpu:{raw}", {"rows": cleared}))
    return cleared


@admin(
    responses={200: Answer("every upstream", UpstreamList)},
    uses_store=False,
)
async def list_upstreams(gateway: Gateway) -> UpstreamList:
    """Every upstream with its endpoints' health, load and rotation."""
    return UpstreamList(
        upstreams=[upstream_state(u, gateway) for u in gateway.registry.upstreams()]
    )


@admin(
    responses={200: Answer("every GPU and exporter; `dormant` without gpu_health", GpusView)},
    uses_store=False,
)
async def list_gpus(gateway: Gateway) -> GpusView:
    """Every GPU row: readings, verdict, reasons, mapped upstreams; and each exporter's state.

    A row is the entry `gpugate gpus inspect --json` gives the GPU's newest scrape, with the
    gateway's verdict: a fault it holds is `faulted` although that scrape alone may be `ok`;
    else inspect's `ok` or `unknown`. Then `upstreams`, `stale` and `saturated` (their reasons
    follow inspect's); `fault_reason` and `faulted_since` are set while a fault holds.
    """
    return gpus_state(gateway)


@admin(
    responses={200: Answer("the rows whose fault was cleared", GpuCleared)},
    errors={
        400: "BAD_REQUEST: not a GPU id, or gpu_health is dormant",
        404: "UNKNOWN_GPU: no exporter has shown a GPU with that id",
    },
)
async def clear_gpu(gateway: Gateway, path: GpuPath, headers: AdminHeaders) -> GpuCleared:
    """Clear a GPU's held fault at once (`0`, or `host/0` with several exporters); audited."""
    cleared = await clear_gpu_fault(gateway, path.gpu, headers.actor)
    return GpuCleared(gpu=path.gpu, cleared=cleared)


routes = [
    route("/admin/upstreams", list_upstreams, "GET"),
    route("/admin/gpus", list_gpus, "GET"),
    route("/admin/gpus/{gpu:path}/clear", clear_gpu, "POST"),
]
