"""What each console page shows, read from the same services and views as the admin API.

Nothing here decides anything: the runtimes come from :class:`RuntimeOps` through the admin API's
``runtime_view``, the GPUs from the monitor through ``gpus_view``, the upstreams through
``upstream_view``, the jobs and audit log from the store through the jobs API's views. A page is
a dict of plain data for its template.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from gpugate.errors import BadRequest
from gpugate.services.jobs import event_view, job_view
from gpugate.services.samples import MAX_KEYS
from gpugate.store import JOB_STATES
from gpugate.web.admin import gpus_view, upstream_view
from gpugate.web.admin_config import version_view
from gpugate.web.admin_keys import usage_view
from gpugate.web.admin_runtimes import audit_view, parse_since, runtime_view
from gpugate.web.console import charts
from gpugate.web.console.charts import Chart
from gpugate.web.schemas.common import validation_message
from gpugate.web.schemas.keys import UsageQuery

if TYPE_CHECKING:
    from gpugate.services.runtime_ops import RuntimeOps
    from gpugate.services.samples import Sampler
    from gpugate.wiring import Gateway

PAGE = 50
RECENT_JOBS = 10
ERROR_CLASSES = ("s5", "s1", "s3", "s6", "s7")  # red, orange, purple, brown, slate
OPTIONAL_CHARTS = ("attempts", "fallbacks", "tokens", "key_tokens")  # retries; keys' tokens
OUTCOME_CHARTS = frozenset({"attempts", "fallbacks"})  # coloured like the requests: ok green
GAP_SAMPLES = 2.5  # a line breaks where more than this many sample intervals are missing


def _ops(gateway: Gateway) -> RuntimeOps:
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
        "charts": await asyncio.to_thread(fleet_charts, gateway),  # ~30 ms with a full ring
    }


def _budget_rules(daily_cents: float | None) -> list[tuple[str, float]]:
    """The daily budget (soft cap) and twice it (over budget: skipped in the walk), in $."""
    if not daily_cents:
        return []
    return [("daily budget", daily_cents / 100), ("over budget (2x)", 2 * daily_cents / 100)]


def spend_chart(spend: dict[str, Any]) -> Chart:
    """Dollars per UTC day for ``spend["days"]`` (the ledger's last 14 days, oldest first),
    against the daily budget and twice it."""
    bars = [(d["day"][5:], float(d["cents"]) / 100) for d in spend["days"]]
    rules = _budget_rules(spend.get("daily_cents"))
    return charts.bar_chart("spend-chart", "Spend per UTC day", "$", bars, rules=rules)


def _line(ring: Sampler, name: str, keys: list[str] | None = None, **kw: Any) -> Chart:
    series = ring.series[name]
    return charts.line_chart(
        f"chart-{name.replace('_', '-')}",
        series.title,
        series.unit,
        ring.window(name, keys),
        span=ring.span,
        gap_s=GAP_SAMPLES * ring.every_s,
        **kw,
    )


def fault_bands(ring: Sampler) -> list[charts.Band]:
    """Each run of samples in which a GPU was faulted, as a band to shade."""
    bands = []
    for gpu, points in ring.window("gpu_faulted").items():
        start = end = None
        for at, faulted in [*points, (math.inf, 0.0)]:
            if faulted >= 1:
                start = at if start is None else start
                end = at
            elif start is not None and end is not None:
                bands.append(charts.Band(start, end + ring.every_s, f"GPU {gpu} faulted"))
                start = end = None
    return bands


def code_classes(codes: Iterable[str]) -> dict[str, str]:
    """Answered (``2xx``, a try's ``ok``) in green, every other outcome in a warm colour of its
    own."""
    warm = iter(ERROR_CLASSES * (1 + MAX_KEYS // len(ERROR_CLASSES)))
    return {c: "ok" if c.startswith("2") or c == "ok" else next(warm) for c in sorted(codes)}


def fleet_charts(gateway: Gateway) -> list[Chart]:
    """The incident at a glance: requests by code, latency, TTFB, queues, GPU util and
    temperature per GPU, every chart with the GPU faults shaded."""
    ring = gateway.samples
    faults = fault_bands(ring)
    codes = ring.window("requests")
    shown = [
        _line(ring, "requests", bands=faults, classes=code_classes(codes)),
        _line(ring, "latency", bands=faults),
        _line(ring, "ttfb", bands=faults),
        _line(ring, "queue", bands=faults),
    ]
    # drawn once their metric has counted anything
    for name in OPTIONAL_CHARTS:
        if keys := ring.window(name):
            classes = code_classes(keys) if name in OUTCOME_CHARTS else None
            shown.append(_line(ring, name, bands=faults, classes=classes))
    if gateway.monitor is not None:
        shown.append(_line(ring, "gpu_util", bands=faults, min_top=100))
        shown.append(_line(ring, "gpu_temp", bands=faults, min_top=100))
    return shown


def runtime_charts(gateway: Gateway, runtime_id: str, spend: dict[str, Any]) -> list[Chart]:
    """Jobs queued and calls in flight over the last hour, spend today over it (with a budget),
    spend per day from the ledger."""
    shown = []
    ring = gateway.samples
    jobs = {
        "queued": ring.window("jobs_queued", [runtime_id]).get(runtime_id, []),
        "in flight": ring.window("jobs_in_flight", [runtime_id]).get(runtime_id, []),
    }
    shown.append(
        charts.line_chart(
            "chart-jobs",
            "Jobs queued and calls in flight",
            "jobs",
            jobs,
            span=ring.span,
            gap_s=GAP_SAMPLES * ring.every_s,
        )
    )
    if spend.get("daily_cents"):
        rules = _budget_rules(spend["daily_cents"])
        today = _line(
            ring,
            "spend_today",
            [runtime_id],
            labels={runtime_id: "spent today"},
            rules=rules,
            min_top=0.01,
        )
        shown.append(today)
    shown.append(spend_chart(spend))
    return shown


async def runtime(gateway: Gateway, runtime_id: str) -> dict[str, Any]:
    view = runtime_view(await _ops(gateway).detail(runtime_id))
    recent = await gateway.jobs.list(state=None, runner=runtime_id, limit=RECENT_JOBS, cursor=None)
    return {
        "runtime": view,
        "charts": await asyncio.to_thread(runtime_charts, gateway, runtime_id, view["spend"]),
        "recent_jobs": [job_view(j) for j in recent.jobs],
    }


async def jobs(
    gateway: Gateway, *, state: str | None, runner: str | None, cursor: str | None
) -> dict[str, Any]:
    page = await gateway.jobs.list(state=state, runner=runner, limit=PAGE, cursor=cursor)
    return {
        "jobs": [job_view(j) for j in page.jobs],
        "next_cursor": page.next_cursor,
        "states": JOB_STATES,
        "runners": _ops(gateway).ids(),
        "filters": {"state": state or "", "runner": runner or ""},
    }


async def job(gateway: Gateway, slug: str) -> dict[str, Any]:
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
