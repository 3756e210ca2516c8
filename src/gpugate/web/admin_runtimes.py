"""``/admin/runtimes`` (list, detail, enable / disable / drain) and ``/admin/audit``."""

from __future__ import annotations

from datetime import datetime
from functools import partial
from typing import TYPE_CHECKING, Any

from gpugate.errors import BadRequest
from gpugate.services.guardrails import Spend
from gpugate.store.runtime_state import DISABLED, DRAINED, ENABLED
from gpugate.web.api import Endpoint, operation, route
from gpugate.web.schemas.admin import (
    MAX_REASON,
    AdminHeaders,
    AuditList,
    AuditQuery,
    AuditView,
    LastSubmitView,
    LedgerView,
    ReasonBody,
    RuntimeHealth,
    RuntimeList,
    RuntimePath,
    RuntimeView,
    SpendDayView,
    SpendView,
    StateChange,
    StateView,
)
from gpugate.web.schemas.operation import Answer, Security
from gpugate.wiring import Gateway

if TYPE_CHECKING:
    from gpugate.services.runtime_ops import RuntimeDetail, RuntimeOps
    from gpugate.store import AuditRecord
    from gpugate.store.runtime_state import RuntimeState

__all__ = ["MAX_REASON", "VERBS", "audit_view", "parse_since", "routes", "runtime_view"]

VERBS = {"enable": ENABLED, "disable": DISABLED, "drain": DRAINED}
TAGS = ("admin",)
admin = partial(operation, Security.ADMIN, tags=TAGS)  # every operation here
UNKNOWN_RUNTIME = {404: "UNKNOWN_RUNTIME"}


def _ops(gateway: Gateway) -> RuntimeOps:
    return gateway.runtime_ops


def audit_view(event: AuditRecord) -> dict[str, Any]:
    """One audit event as JSON data, for the console's pages."""
    return AuditView.of(event).as_json()


def _state(state: RuntimeState | None) -> StateView:
    if state is None:
        return StateView(state=ENABLED, reason=None, actor=None, since=None)
    return StateView(
        state=state.state, reason=state.reason or None, actor=state.actor, since=state.since
    )


def _spend(detail: RuntimeDetail) -> SpendView:
    """A runtime's spend: today (UTC), the last 14 days for the chart, its latest entries."""
    spend = detail.spend
    budget = detail.config.budget
    if spend is None:
        daily = None if budget is None else budget.daily_cents
        spend = Spend(daily, None, over_budget=False, soft_cap=False)
    return SpendView(
        daily_cents=spend.daily_cents,
        estimate_cents=None if budget is None else budget.estimate_cents,
        today_cents=spend.today_cents,
        over_budget=spend.over_budget,
        soft_cap=spend.soft_cap,
        days=[SpendDayView.of(day) for day in spend.days],
        ledger=[LedgerView.of(entry) for entry in spend.ledger],
    )


def runtime_state(detail: RuntimeDetail) -> RuntimeView:
    """One runtime as the admin API shows it."""
    cfg = detail.config
    health = RuntimeHealth(
        **_state(detail.state).model_dump(),
        config_enabled=cfg.enabled,
        implemented=detail.implemented,
        reachable=detail.reachable,
        takes_dispatch=detail.takes_dispatch,
        auto_disables=[AuditView.of(e) for e in detail.auto_disables],
        history=[AuditView.of(e) for e in detail.history],
    )
    last = detail.last_submit
    return RuntimeView(
        id=cfg.id,
        kind=cfg.kind,
        models=list(cfg.models),
        max_concurrency=cfg.max_concurrency,
        queue_depth=detail.queue_depth,
        in_flight=detail.in_flight,
        last_submit=None if last is None else LastSubmitView.of(last),
        health=health,
        spend=_spend(detail),
    )


def runtime_view(detail: RuntimeDetail) -> dict[str, Any]:
    """:func:`runtime_state` as JSON data, for the console's pages."""
    return runtime_state(detail).as_json()


@admin(responses={200: Answer("every runtime", RuntimeList)})
async def list_runtimes(gateway: Gateway) -> RuntimeList:
    """Every runtime, in the config's order, as in `GET /admin/runtimes/{runtime}`."""
    ops = _ops(gateway)
    return RuntimeList(runtimes=[runtime_state(await ops.detail(rid)) for rid in ops.ids()])


@admin(
    responses={200: Answer("the runtime", RuntimeView)},
    errors=UNKNOWN_RUNTIME,
)
async def get_runtime(gateway: Gateway, path: RuntimePath) -> RuntimeView:
    """One runtime: queue depth, in flight, last submit, health and why, spend.

    `health.state` is the operator state (enabled, disabled, drained) with its reason, actor
    and since; `health.auto_disables` the times a stop condition disabled it (actor
    `gateway...`); `health.reachable` is null where nothing probes the runtime yet.
    `spend` (null figures for a runtime without a budget): `daily_cents`, `today_cents`
    (UTC day: settled costs plus open reservations), `over_budget` (today >= 2 x daily:
    skipped in the walk), `soft_cap` (today >= daily), `days` (`[{day, cents}]`, the last
    14 days, oldest first) and `ledger` (latest entries, newest first: `state` reserved,
    settled or released; `source` estimated or reported).
    """
    return runtime_state(await _ops(gateway).detail(path.runtime))


def _verb(verb: str) -> Endpoint:
    state = VERBS[verb]

    async def change_state(
        gateway: Gateway, path: RuntimePath, headers: AdminHeaders, body: ReasonBody
    ) -> StateChange:
        stored = await _ops(gateway).set_state(path.runtime, state, body.reason, headers.actor)
        return StateChange(runtime=stored.runtime, **_state(stored).model_dump())

    change_state.__name__ = f"{verb}_runtime"
    change_state.__doc__ = f"""{verb.capitalize()} a runtime; audited with the actor and reason.

    Persisted in the store, so it holds across restarts and every replica follows it within
    `server.config_poll_s`. Only an enabled runtime takes new dispatch.
    """
    declare = admin(
        responses={200: Answer("the runtime's state now", StateChange)},
        errors=UNKNOWN_RUNTIME,
        body_required=False,
    )
    return declare(change_state)


def parse_since(raw: str | None) -> datetime | None:
    """A ``since`` filter: ISO-8601 with a timezone (:class:`BadRequest` otherwise)."""
    if raw is None:
        return None
    try:
        moment = datetime.fromisoformat(raw)
    except ValueError as exc:
        raise BadRequest(f"since must be an ISO-8601 time, got {raw[:40]!r}") from exc
    if moment.utcoffset() is None:
        raise BadRequest("since must carry a timezone (e.g. 2025-01-01T00:00:00+00:00)")
    return moment


@admin(responses={200: Answer("a page of events", AuditList)})
async def list_audit(gateway: Gateway, query: AuditQuery) -> AuditList:
    """The audit log, newest first, filtered (every filter given must hold).

    `action` (e.g. runtime.disabled, config.saved), `subject` (e.g. runtime:home-1, config),
    `actor` (e.g. admin:alice, gateway), `since` (ISO-8601 with a timezone); `limit` (1-500,
    default 100); `cursor` (the `next_cursor` of the previous page).
    """
    events = await gateway.store.list_audit(
        action=query.action,
        subject=query.subject,
        actor=query.actor,
        since=query.since,
        limit=query.limit,
        before_id=query.cursor,
    )
    cursor = str(events[-1].id) if len(events) == query.limit else None
    return AuditList(data=[AuditView.of(e) for e in events], next_cursor=cursor)


routes = [
    route("/admin/runtimes", list_runtimes, "GET"),
    route("/admin/runtimes/{runtime}", get_runtime, "GET"),
    *(route(f"/admin/runtimes/{{runtime}}/{verb}", _verb(verb), "POST") for verb in VERBS),
    route("/admin/audit", list_audit, "GET"),
]
