"""``/admin/runtimes`` (list, detail, enable / disable / drain) and ``/admin/audit``."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gpugate.errors import BadRequest
from gpugate.services.guardrails import Spend
from gpugate.store.runtime_state import DISABLED, DRAINED, ENABLED
from gpugate.web.admin import admin, admin_actor
from gpugate.web.bodies import json_body

if TYPE_CHECKING:
    from starlette.requests import Request

    from gpugate.services.runtime_ops import RuntimeDetail, RuntimeOps
    from gpugate.store import AuditRecord
    from gpugate.store.runtime_state import LastSubmit, RuntimeState
    from gpugate.wiring import Gateway

MAX_AUDIT = 500
MAX_REASON = 500
VERBS = {"enable": ENABLED, "disable": DISABLED, "drain": DRAINED}


def _ops(gateway: Gateway) -> RuntimeOps:
    assert gateway.runtime_ops is not None
    return gateway.runtime_ops


def audit_view(event: AuditRecord) -> dict[str, Any]:
    return {
        "id": event.id,
        "at": event.at.isoformat(),
        "actor": event.actor,
        "action": event.action,
        "subject": event.subject,
        "detail": event.detail,
    }


def _state_view(state: RuntimeState | None) -> dict[str, Any]:
    if state is None:
        return {"state": ENABLED, "reason": None, "actor": None, "since": None}
    return {
        "state": state.state,
        "reason": state.reason or None,
        "actor": state.actor,
        "since": state.since.isoformat(),
    }


def _last_submit_view(last: LastSubmit | None) -> dict[str, Any] | None:
    if last is None:
        return None
    return {
        "at": last.at.isoformat(),
        "job": last.slug,
        "call_id": last.call_id,
        "outcome": last.outcome,
        "error_code": last.error_code,
        "outcome_at": last.outcome_at.isoformat(),
    }


def _spend_view(detail: RuntimeDetail) -> dict[str, Any]:
    """A runtime's spend: today (UTC), the last 14 days for the chart, its latest entries."""
    spend = detail.spend
    budget = detail.config.budget
    if spend is None:
        daily = None if budget is None else budget.daily_cents
        spend = Spend(daily, None, over_budget=False, soft_cap=False)
    return {
        "daily_cents": spend.daily_cents,
        "estimate_cents": None if budget is None else budget.estimate_cents,
        "today_cents": spend.today_cents,
        "over_budget": spend.over_budget,
        "soft_cap": spend.soft_cap,
        "days": [{"day": d.day.isoformat(), "cents": d.cents} for d in spend.days],
        "ledger": [
            {
                "id": e.id,
                "day": e.day.isoformat(),
                "job": e.slug,
                "call_id": e.call_id,
                "cents": e.cents,
                "source": e.source,
                "state": e.state,
                "at": e.at.isoformat(),
                "settled_at": None if e.settled_at is None else e.settled_at.isoformat(),
            }
            for e in spend.ledger
        ],
    }


def runtime_view(detail: RuntimeDetail) -> dict[str, Any]:
    """One runtime as the admin API shows it."""
    cfg = detail.config
    return {
        "id": cfg.id,
        "kind": cfg.kind,
        "models": list(cfg.models),
        "max_concurrency": cfg.max_concurrency,
        "queue_depth": detail.queue_depth,
        "in_flight": detail.in_flight,
        "last_submit": _last_submit_view(detail.last_submit),
        "health": {
            **_state_view(detail.state),
            "config_enabled": cfg.enabled,
            "implemented": detail.implemented,
            "reachable": detail.reachable,
            "takes_dispatch": detail.takes_dispatch,
            "auto_disables": [audit_view(e) for e in detail.auto_disables],
            "history": [audit_view(e) for e in detail.history],
        },
        "spend": _spend_view(detail),
    }


@admin
async def list_runtimes(request: Request, gateway: Gateway) -> Response:
    """Every configured runtime with its queue, calls in flight, last submit, health, spend.
    ---
    summary: Every runtime, in the config's order, as in `GET /admin/runtimes/{id}`
    responses:
      200: {description: "{runtimes: [...]}"}
      401: {description: UNAUTHORIZED}
    """
    ops = _ops(gateway)
    details = [await ops.detail(rid) for rid in ops.ids()]
    return JSONResponse({"runtimes": [runtime_view(d) for d in details]})


@admin
async def get_runtime(request: Request, gateway: Gateway) -> Response:
    """One runtime in detail.
    ---
    summary: One runtime - queue depth, in flight, last submit, health and why, spend
    description: >-
      `health.state` is the operator state (enabled, disabled, drained) with its reason, actor
      and since; `health.auto_disables` the times a stop condition disabled it (actor
      `gateway...`); `health.reachable` is null where nothing probes the runtime yet.
      `spend` (null figures for a runtime without a budget): `daily_cents`, `today_cents`
      (UTC day: settled costs plus open reservations), `over_budget` (today >= 2 x daily:
      skipped in the walk), `soft_cap` (today >= daily), `days` (`[{day, cents}]`, the last
      14 days, oldest first) and `ledger` (latest entries, newest first: `state` reserved,
      settled or released; `source` estimated or reported).
    responses:
      200: {description: the runtime}
      401: {description: UNAUTHORIZED}
      404: {description: UNKNOWN_RUNTIME}
    """
    detail = await _ops(gateway).detail(request.path_params["runtime"])
    return JSONResponse(runtime_view(detail))


async def _reason(request: Request) -> str:
    reason = (await json_body(request, empty_ok=True)).get("reason", "")
    if not isinstance(reason, str) or len(reason) > MAX_REASON:
        raise BadRequest(f'expected {{"reason": "<text of at most {MAX_REASON} characters>"}}')
    return reason


def _verb(verb: str) -> Any:
    state = VERBS[verb]

    @admin
    async def change_state(request: Request, gateway: Gateway) -> Response:
        reason = await _reason(request)
        stored = await _ops(gateway).set_state(
            request.path_params["runtime"], state, reason, admin_actor(request)
        )
        return JSONResponse({"runtime": stored.runtime, **_state_view(stored)})

    change_state.__name__ = f"{verb}_runtime"
    change_state.__doc__ = f"""{verb.capitalize()} a runtime.
    ---
    summary: '{verb} a runtime (optional body {{"reason": "..."}}), audited with the actor'
    description: >-
      Persisted in the store, so it holds across restarts and every replica follows it within
      `server.config_poll_s`. Only an enabled runtime takes new dispatch.
    responses:
      200: {{description: "{{runtime, state, reason, actor, since}}"}}
      401: {{description: UNAUTHORIZED}}
      404: {{description: UNKNOWN_RUNTIME}}
    """
    return change_state


def parse_since(raw: str | None) -> datetime | None:
    if raw is None:
        return None
    try:
        moment = datetime.fromisoformat(raw)
    except ValueError as exc:
        raise BadRequest(f"since must be an ISO-8601 time, got {raw[:40]!r}") from exc
    if moment.utcoffset() is None:
        raise BadRequest("since must carry a timezone (e.g. 2025-01-01T00:00:00+00:00)")
    return moment


def _int_param(request: Request, name: str, default: str, top: int) -> int:
    raw = request.query_params.get(name, default)
    if not raw.isdigit() or not 1 <= int(raw[:20]) <= top:
        raise BadRequest(f"{name} must be 1 to {top}")
    return int(raw)


@admin
async def list_audit(request: Request, gateway: Gateway) -> Response:
    """The audit log, newest first, filtered.
    ---
    summary: Audit events, newest first
    description: >-
      Filters (all optional, all must hold): `action` (e.g. runtime.disabled, config.saved),
      `subject` (e.g. runtime:home-1, config), `actor` (e.g. admin:alice, gateway), `since`
      (ISO-8601 with a timezone); `limit` (1-500, default 100); `cursor` (the `next_cursor` of
      the previous page).
    responses:
      200: {description: "{data: [{id, at, actor, action, subject, detail}], next_cursor}"}
      400: {description: BAD_REQUEST}
      401: {description: UNAUTHORIZED}
    """
    q = request.query_params
    limit = _int_param(request, "limit", "100", MAX_AUDIT)
    before = _int_param(request, "cursor", "0", 2**63 - 1) if "cursor" in q else None
    events = await gateway.store.list_audit(
        action=q.get("action"),
        subject=q.get("subject"),
        actor=q.get("actor"),
        since=parse_since(q.get("since")),
        limit=limit,
        before_id=before,
    )
    cursor = str(events[-1].id) if len(events) == limit else None
    return JSONResponse({"data": [audit_view(e) for e in events], "next_cursor": cursor})


routes = [
    Route("/admin/runtimes", list_runtimes, methods=["GET"]),
    Route("/admin/runtimes/{runtime}", get_runtime, methods=["GET"]),
    *(
        Route(f"/admin/runtimes/{{runtime}}/{verb}", _verb(verb), methods=["POST"])
        for verb in VERBS
    ),
    Route("/admin/audit", list_audit, methods=["GET"]),
]
