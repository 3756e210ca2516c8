"""What each console page shows, read from the same services and views as the admin API.

Nothing here decides anything: the runtimes come from :class:`RuntimeOps` through the admin API's
``runtime_view``, the GPUs from the monitor through ``gpus_view``, the upstreams through
``upstream_view``, the jobs and audit log from the store through the jobs API's views. A page is
a dict of plain data for its template.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from gpugate.errors import BadRequest
from gpugate.services.jobs import event_view, job_view
from gpugate.store import JOB_STATES
from gpugate.web.admin import gpus_view, upstream_view
from gpugate.web.admin_config import version_view
from gpugate.web.admin_keys import usage_view
from gpugate.web.admin_runtimes import audit_view, parse_since, runtime_view
from gpugate.web.schemas.common import validation_message
from gpugate.web.schemas.keys import UsageQuery

if TYPE_CHECKING:
    from gpugate.services.runtime_ops import RuntimeOps
    from gpugate.wiring import Gateway

PAGE = 50
RECENT_JOBS = 10


def _ops(gateway: Gateway) -> RuntimeOps:
    assert gateway.runtime_ops is not None
    return gateway.runtime_ops


def shed_counts(gateway: Gateway) -> dict[str, int]:
    """``gateway_gpu_shed_total`` by admission site (sync proxy, jobs, ...), this process."""
    counts: dict[str, int] = {}
    for family in gateway.metrics.gpu_shed.collect():
        for sample in family.samples:
            if sample.name.endswith("_total"):
                counts[sample.labels["site"]] = int(sample.value)
    return counts


async def runtimes(gateway: Gateway, *, history: bool = False) -> list[dict[str, Any]]:
    ops = _ops(gateway)
    return [runtime_view(await ops.detail(rid, history=history)) for rid in ops.ids()]


async def overview(gateway: Gateway) -> dict[str, Any]:
    """The fleet: upstreams with endpoint health and GPU coupling, GPUs, exporters, runtimes."""
    monitor = gateway.monitor
    upstreams = []
    for upstream in gateway.registry.upstreams():
        view = upstream_view(upstream, gateway)
        view["guard"] = monitor.guard(upstream.id) if monitor else None
        view["saturated"] = monitor.saturated(upstream.id) if monitor else False
        upstreams.append(view)
    gpu_health = gateway.config.gpu_health
    return {
        "upstreams": upstreams,
        **gpus_view(gateway),
        "shed": shed_counts(gateway),
        "shed_batch": bool(gpu_health and gpu_health.shed_batch),
        "runtimes": await runtimes(gateway),
        "config_version": gateway.config_version,
    }


def chart(spend: dict[str, Any]) -> dict[str, Any]:
    """Bars for ``spend["days"]`` (the runtime detail's last 14 UTC days, oldest first), scaled
    to the largest of them and twice the daily budget (the over-budget line)."""
    days = spend["days"]
    budget = spend.get("daily_cents")
    top = max([float(d["cents"]) for d in days] + ([2 * float(budget)] if budget else []) + [1.0])
    bars = [
        {"day": d["day"], "cents": float(d["cents"]), "pct": 100.0 * float(d["cents"]) / top}
        for d in days
    ]
    lines = {}
    if budget:
        lines = {"soft": 100.0 * float(budget) / top, "over": 100.0 * 2 * float(budget) / top}
    return {"bars": bars, "lines": lines, "budget": budget}


async def runtime(gateway: Gateway, runtime_id: str) -> dict[str, Any]:
    assert gateway.jobs is not None
    view = runtime_view(await _ops(gateway).detail(runtime_id))
    recent = await gateway.jobs.list(state=None, runner=runtime_id, limit=RECENT_JOBS, cursor=None)
    return {
        "runtime": view,
        "chart": chart(view["spend"]),
        "recent_jobs": [job_view(j) for j in recent.jobs],
    }


async def jobs(
    gateway: Gateway, *, state: str | None, runner: str | None, cursor: str | None
) -> dict[str, Any]:
    assert gateway.jobs is not None
    page = await gateway.jobs.list(state=state, runner=runner, limit=PAGE, cursor=cursor)
    return {
        "jobs": [job_view(j) for j in page.jobs],
        "next_cursor": page.next_cursor,
        "states": JOB_STATES,
        "runners": _ops(gateway).ids(),
        "filters": {"state": state or "", "runner": runner or ""},
    }


async def job(gateway: Gateway, slug: str) -> dict[str, Any]:
    assert gateway.jobs is not None
    record = await gateway.jobs.get(slug)
    events = await gateway.jobs.events(slug)
    return {"job": job_view(record, with_input=True), "events": [event_view(e) for e in events]}


async def audit(gateway: Gateway, filters: dict[str, str], cursor: str | None) -> dict[str, Any]:
    """The audit log, newest first; a bad ``since`` or cursor is shown, not raised."""
    error = None
    try:
        since = parse_since(filters.get("since") or None)
        before = int(cursor) if cursor else None
    except (BadRequest, ValueError) as exc:
        error, since, before = getattr(exc, "message", str(exc)), None, None
    events = await gateway.store.list_audit(
        action=filters.get("action") or None,
        subject=filters.get("subject") or None,
        actor=filters.get("actor") or None,
        since=since,
        limit=PAGE,
        before_id=before,
    )
    return {
        "events": [audit_view(e) for e in events],
        "next_cursor": str(events[-1].id) if len(events) == PAGE else None,
        "filters": filters,
        "filter_error": error,
    }


async def config(gateway: Gateway) -> dict[str, Any]:
    assert gateway.config_versions is not None
    versions = await gateway.config_versions.versions()
    return {
        "current_version": gateway.config_version,
        "versions": [version_view(v, gateway.config_version) for v in versions],
    }


async def usage(gateway: Gateway, filters: dict[str, str]) -> dict[str, Any]:
    """Client keys' usage: a bar per UTC day (tokens, and cents when priced), the totals per
    tenant and per key (``GET /admin/usage``'s figures); a bad filter is shown, not raised."""
    error = None
    try:
        query = UsageQuery.model_validate({k: v for k, v in filters.items() if v})
    except ValidationError as exc:
        error, query = validation_message(exc, filters, UsageQuery), UsageQuery()
    view = (await usage_view(gateway, query)).as_json()
    per_day: dict[str, dict[str, float]] = {}
    for row in view["data"]:
        day = per_day.setdefault(row["day"], {"tokens": 0.0, "cents": 0.0})
        day["tokens"] += row["prompt_tokens"] + row["completion_tokens"]
        day["cents"] += row["cents"]
    top = max([d["tokens"] for d in per_day.values()] + [1.0])
    bars = [
        {"day": day, **figures, "pct": 100.0 * figures["tokens"] / top}
        for day, figures in sorted(per_day.items())
    ]
    keys = {key.id: key for key in await gateway.store.list_keys()}
    return {
        "bars": bars,
        "by_tenant": view["by_tenant"],
        "by_key": {
            key_id: {**total, "name": keys[key_id].name if key_id in keys else key_id}
            for key_id, total in view["by_key"].items()
        },
        "filters": filters,
        "filter_error": error,
        "mode": gateway.config.auth.mode,
    }
