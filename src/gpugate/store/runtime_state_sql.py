"""The runtime states (:mod:`gpugate.store.runtime_state`), once for both backends.

A state change is the old state read (PostgreSQL: ``FOR UPDATE``, so two changes of one stored
runtime cannot both read the same "previous"), one upsert and its audit event, in one
transaction (SQLite: one ``BEGIN IMMEDIATE``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpugate.store.audit import insert_audit
from gpugate.store.base import AuditEvent
from gpugate.store.dialect import sql
from gpugate.store.jobs_base import check_runtime
from gpugate.store.runtime_state import (
    ENABLED,
    LastSubmit,
    RuntimeState,
    check_state,
    runtime_subject,
    state_action,
)
from gpugate.store.tx import Driven, first, one, rows

if TYPE_CHECKING:
    from gpugate.store.tx import Codec, Row, Tx

_STATES = sql("SELECT runtime, state, reason, actor, since FROM runtime_states")
_HELD = sql("SELECT state FROM runtime_states WHERE runtime = :runtime FOR UPDATE")
_UPSERT = sql("""
INSERT INTO runtime_states AS held (runtime, state, reason, actor, since)
VALUES (:runtime, :state, :reason, :actor, :now)
ON CONFLICT (runtime) DO UPDATE SET
    state = excluded.state, reason = excluded.reason, actor = excluded.actor,
    since = CASE WHEN held.state = excluded.state THEN held.since ELSE excluded.since END
RETURNING runtime, state, reason, actor, since""")
_LAST_SUBMIT = sql("""
SELECT e.id, e.job_id, j.slug, e.at, e.call_id FROM job_events e JOIN jobs j ON j.id = e.job_id
WHERE e.runtime = :runtime AND e.status = 'submitted'
ORDER BY e.id DESC LIMIT 1""")
_OUTCOME = sql("""
SELECT status, error_code, at FROM job_events
WHERE job_id = :job_id AND runtime = :runtime AND id >= :id
ORDER BY id DESC LIMIT 1""")


def _state(c: Codec, row: Row) -> RuntimeState:
    runtime, state, reason, actor, since = row
    return RuntimeState(runtime, state, reason, actor, c.time(since))


def _set_state(c: Codec, params: dict[str, Any]) -> Tx[RuntimeState]:
    held = yield from first(_HELD, params)
    stored = _state(c, (yield from one(_UPSERT, params)))
    state, runtime = params["state"], params["runtime"]
    detail = {"state": state, "previous": ENABLED if held is None else held[0]}
    detail["reason"] = params["reason"]
    event = AuditEvent(params["actor"], state_action(state), runtime_subject(runtime), detail)
    yield from insert_audit(c, params["now"], event)
    return stored


def _last_submit(c: Codec, runtime: str) -> Tx[LastSubmit | None]:
    row = yield from first(_LAST_SUBMIT, {"runtime": runtime})
    if row is None:
        return None
    event_id, job_id, slug, at, call_id = row
    params = {"job_id": job_id, "runtime": runtime, "id": event_id}
    status, error_code, outcome_at = yield from one(_OUTCOME, params)
    return LastSubmit(c.time(at), slug, call_id, status, error_code, c.time(outcome_at))


class RuntimeStateSql(Driven):
    """The :class:`gpugate.store.runtime_state.RuntimeStateStore` methods."""

    async def set_runtime_state(
        self, runtime: str, state: str, reason: str, actor: str
    ) -> RuntimeState:
        check_runtime(runtime)
        check_state(state)
        params: dict[str, Any] = {"runtime": runtime, "state": state, "reason": reason}
        params |= {"actor": actor, "now": self._clock.now()}
        return await self._transact(_set_state(self._codec, params))

    async def runtime_states(self) -> dict[str, RuntimeState]:
        found = await self._query(rows(_STATES))
        return {row[0]: _state(self._codec, row) for row in found}

    async def last_submit(self, runtime: str) -> LastSubmit | None:
        return await self._query(_last_submit(self._codec, runtime), single=False)
