"""The runtime states of the SQLite store: a mixin of :class:`gpugate.store.sqlite.SqliteStore`.

Each method is one hop to the store's thread; a state change and its audit event are one
``BEGIN IMMEDIATE`` transaction.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeVar

from gpugate.store.base import AuditEvent
from gpugate.store.jobs_base import check_runtime
from gpugate.store.runtime_state import (
    ENABLED,
    LastSubmit,
    RuntimeState,
    check_state,
    runtime_subject,
    state_action,
)
from gpugate.store.sqlite_audit import insert_audit
from gpugate.store.sqlite_codec import text_time, time_text

if TYPE_CHECKING:
    import sqlite3
    from collections.abc import Callable

    from gpugate.clock import Clock

T = TypeVar("T")

_STATE_COLUMNS = "runtime, state, reason, actor, since"
_SELECT_STATE = f"SELECT {_STATE_COLUMNS} FROM runtime_states"  # noqa: S608 -- constants only
_UPSERT_STATE = f"""
INSERT INTO runtime_states (runtime, state, reason, actor, since)
VALUES (:runtime, :state, :reason, :actor, :now)
ON CONFLICT (runtime) DO UPDATE SET
    state = excluded.state, reason = excluded.reason, actor = excluded.actor,
    since = CASE WHEN runtime_states.state = excluded.state THEN runtime_states.since
                 ELSE excluded.since END
RETURNING {_STATE_COLUMNS}"""  # noqa: S608 -- constants only; values are bound
_LAST_SUBMIT = """
SELECT e.id, e.job_id, j.slug, e.at, e.call_id FROM job_events e JOIN jobs j ON j.id = e.job_id
WHERE e.runtime = :runtime AND e.status = 'submitted'
ORDER BY e.id DESC LIMIT 1"""
_OUTCOME = """
SELECT status, error_code, at FROM job_events
WHERE job_id = :job_id AND runtime = :runtime AND id >= :id
ORDER BY id DESC LIMIT 1"""


class SqliteRuntimeState:
    """The :class:`gpugate.store.runtime_state.RuntimeStateStore` methods of the SQLite store."""

    _clock: Clock

    if TYPE_CHECKING:

        async def _read(self, work: Callable[[sqlite3.Connection], T]) -> T: ...

        async def _write(self, work: Callable[[sqlite3.Connection], T]) -> T: ...

    async def set_runtime_state(
        self, runtime: str, state: str, reason: str, actor: str
    ) -> RuntimeState:
        check_runtime(runtime)
        check_state(state)
        now = time_text(self._clock.now())
        params: dict[str, object] = {"runtime": runtime, "state": state, "reason": reason}
        params |= {"actor": actor, "now": now}

        def work(conn: sqlite3.Connection) -> RuntimeState:
            row = conn.execute(f"{_SELECT_STATE} WHERE runtime = ?", (runtime,)).fetchone()
            previous = ENABLED if row is None else row[1]
            stored = _state(conn.execute(_UPSERT_STATE, params).fetchone())
            detail = {"state": state, "previous": previous, "reason": reason}
            event = AuditEvent(actor, state_action(state), runtime_subject(runtime), detail)
            insert_audit(conn, now, event)
            return stored

        return await self._write(work)

    async def runtime_states(self) -> dict[str, RuntimeState]:
        def work(conn: sqlite3.Connection) -> dict[str, RuntimeState]:
            return {row[0]: _state(row) for row in conn.execute(_SELECT_STATE)}

        return await self._read(work)

    async def last_submit(self, runtime: str) -> LastSubmit | None:
        def work(conn: sqlite3.Connection) -> LastSubmit | None:
            row = conn.execute(_LAST_SUBMIT, {"runtime": runtime}).fetchone()
            if row is None:
                return None
            event_id, job_id, slug, at, call_id = row
            params = {"job_id": job_id, "runtime": runtime, "id": event_id}
            status, error_code, outcome_at = conn.execute(_OUTCOME, params).fetchone()
            return LastSubmit(
                text_time(at), slug, call_id, status, error_code, text_time(outcome_at)
            )

        return await self._read(work)


def _state(row: tuple[Any, ...]) -> RuntimeState:
    runtime, state, reason, actor, since = row
    return RuntimeState(runtime, state, reason, actor, text_time(since))
