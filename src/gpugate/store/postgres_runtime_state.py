"""The runtime states of the PostgreSQL store: a mixin of
:class:`gpugate.store.postgres.PostgresStore`.

A state change is one upsert and its audit event in one transaction; concurrent changes of one
runtime serialise on its row (the upsert locks it), so ``previous`` in each event is the state
that change replaced.
"""

from __future__ import annotations

from datetime import UTC
from typing import TYPE_CHECKING

from gpugate.errors import StoreError
from gpugate.store.base import AuditEvent
from gpugate.store.jobs_base import check_runtime
from gpugate.store.postgres_audit import insert_audit
from gpugate.store.runtime_state import (
    ENABLED,
    LastSubmit,
    RuntimeState,
    check_state,
    runtime_subject,
    state_action,
)

if TYPE_CHECKING:
    from contextlib import AbstractAsyncContextManager

    import psycopg
    from psycopg.rows import TupleRow

    from gpugate.clock import Clock

    Connection = psycopg.AsyncConnection[TupleRow]

_STATE_COLUMNS = "runtime, state, reason, actor, since"
_SELECT_STATE = f"SELECT {_STATE_COLUMNS} FROM runtime_states"  # noqa: S608 -- constants only
# The old state is read FOR UPDATE first, so two changes of one stored runtime cannot both read
# the same "previous" (the very first change of a runtime has no row to lock: both say enabled).
_LOCK_STATE = "SELECT state FROM runtime_states WHERE runtime = %(runtime)s FOR UPDATE"
_UPSERT_STATE = f"""
INSERT INTO runtime_states AS held (runtime, state, reason, actor, since)
VALUES (%(runtime)s, %(state)s, %(reason)s, %(actor)s, %(now)s)
ON CONFLICT (runtime) DO UPDATE SET
    state = excluded.state, reason = excluded.reason, actor = excluded.actor,
    since = CASE WHEN held.state = excluded.state THEN held.since ELSE excluded.since END
RETURNING {_STATE_COLUMNS}"""  # noqa: S608 -- constants only; values are bound
_LAST_SUBMIT = """
SELECT e.id, e.job_id, j.slug, e.at, e.call_id FROM job_events e JOIN jobs j ON j.id = e.job_id
WHERE e.runtime = %(runtime)s AND e.status = 'submitted'
ORDER BY e.id DESC LIMIT 1"""
_OUTCOME = """
SELECT status, error_code, at FROM job_events
WHERE job_id = %(job_id)s AND runtime = %(runtime)s AND id >= %(id)s
ORDER BY id DESC LIMIT 1"""


class PostgresRuntimeState:
    """The :class:`gpugate.store.runtime_state.RuntimeStateStore` methods of PostgreSQL."""

    _clock: Clock

    if TYPE_CHECKING:

        def _transaction(
            self, *, single: bool = False
        ) -> AbstractAsyncContextManager[Connection]: ...

    async def set_runtime_state(
        self, runtime: str, state: str, reason: str, actor: str
    ) -> RuntimeState:
        check_runtime(runtime)
        check_state(state)
        now = self._clock.now()
        params: dict[str, object] = {"runtime": runtime, "state": state, "reason": reason}
        params |= {"actor": actor, "now": now}
        async with self._transaction() as conn:
            held = await (await conn.execute(_LOCK_STATE, params)).fetchone()
            previous = ENABLED if held is None else held[0]
            row = await (await conn.execute(_UPSERT_STATE, params)).fetchone()
            if row is None:
                raise StoreError("the runtime state upsert returned no row")
            detail = {"state": state, "previous": previous, "reason": reason}
            event = AuditEvent(actor, state_action(state), runtime_subject(runtime), detail)
            await insert_audit(conn, now, event)
        return _state(row)

    async def runtime_states(self) -> dict[str, RuntimeState]:
        async with self._transaction(single=True) as conn:
            rows = await (await conn.execute(_SELECT_STATE)).fetchall()
        return {row[0]: _state(row) for row in rows}

    async def last_submit(self, runtime: str) -> LastSubmit | None:
        async with self._transaction() as conn:
            row = await (await conn.execute(_LAST_SUBMIT, {"runtime": runtime})).fetchone()
            if row is None:
                return None
            event_id, job_id, slug, at, call_id = row
            params = {"job_id": job_id, "runtime": runtime, "id": event_id}
            outcome = await (await conn.execute(_OUTCOME, params)).fetchone()
        if outcome is None:
            raise StoreError("a submit event without itself among its job's events")
        status, error_code, outcome_at = outcome
        return LastSubmit(
            at.astimezone(UTC), slug, call_id, status, error_code, outcome_at.astimezone(UTC)
        )


def _state(row: TupleRow) -> RuntimeState:
    runtime, state, reason, actor, since = row
    return RuntimeState(runtime, state, reason, actor, since.astimezone(UTC))
