"""What the store keeps of each runtime for the operator plane: the values and the methods,
once for both backends.

* A runtime's operator state — ``enabled``, ``disabled`` or ``drained`` — with why, by whom and
  since when. A runtime without a stored state is enabled. ``set_runtime_state`` writes the
  state and appends its audit event (action ``runtime.<state>``, subject ``runtime:<id>``) in
  ONE transaction, so the audit log is the state's history. Changes the gateway makes on its own
  (stop conditions) use an actor starting with ``gateway`` (:data:`AUTO_ACTOR`), which is how an
  auto-disable is told apart from an operator's. A change reads the old state first
  (PostgreSQL: ``FOR UPDATE``, so two changes of one stored runtime cannot both read the same
  "previous"; SQLite: one ``BEGIN IMMEDIATE``).
* A runtime's last submit, read from the job events: when, which job, and what became of it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from gpugate.core.job_states import check_runtime
from gpugate.store.audit import insert_audit
from gpugate.store.base import AuditEvent
from gpugate.store.dialect import sql
from gpugate.store.tx import Driven, first, one, read, rows

if TYPE_CHECKING:
    from datetime import datetime

    from gpugate.store.tx import Codec, Tx

ENABLED = "enabled"
DISABLED = "disabled"
DRAINED = "drained"
RUNTIME_STATES = (ENABLED, DISABLED, DRAINED)
"""Every operator state of a runtime; only ``enabled`` takes new dispatch."""

AUTO_ACTOR = "gateway"
"""The actor (or actor prefix, ``gateway:<why>``) of a state change the gateway made itself."""


def runtime_subject(runtime: str) -> str:
    """The audit subject of a runtime's events."""
    return "runtime:" + runtime


def state_action(state: str) -> str:
    """The audit action of a change to ``state``."""
    return f"runtime.{state}"


def check_state(state: str) -> str:
    """``state`` if it is one of :data:`RUNTIME_STATES`, else ValueError naming them."""
    if state not in RUNTIME_STATES:
        raise ValueError(f"invalid runtime state {state!r}: expected {', '.join(RUNTIME_STATES)}")
    return state


def is_automatic(actor: str) -> bool:
    """Whether ``actor`` is the gateway itself (a stop condition), not an operator."""
    return actor == AUTO_ACTOR or actor.startswith(AUTO_ACTOR + ":")


@dataclass(frozen=True, slots=True)
class RuntimeState:
    """A runtime's operator state, as stored. ``since`` moves only when ``state`` changes."""

    runtime: str
    state: str
    reason: str
    actor: str
    since: datetime

    @property
    def takes_dispatch(self) -> bool:
        """Only an enabled runtime takes new dispatch."""
        return self.state == ENABLED


@dataclass(frozen=True, slots=True)
class LastSubmit:
    """A runtime's newest submit: when, which job and call, and the newest event of that job on
    this runtime since (``outcome``: ``submitted``, ``running``, ``completed``, ``failed``,
    ``released``, ... with its ``error_code``)."""

    at: datetime
    slug: str
    call_id: str | None
    outcome: str
    error_code: str | None
    outcome_at: datetime


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


def _set_state(c: Codec, params: dict[str, Any]) -> Tx[RuntimeState]:
    held = yield from first(_HELD, params)
    stored = read(c, RuntimeState, (yield from one(_UPSERT, params)))
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
    outcome = yield from one(_OUTCOME, params)
    return read(c, LastSubmit, (at, slug, call_id, *outcome))


class RuntimeStateStore(Driven, Protocol):
    """The operator-plane part of :class:`gpugate.store.Store`."""

    async def set_runtime_state(
        self, runtime: str, state: str, reason: str, actor: str
    ) -> RuntimeState:
        """Store ``runtime``'s state and append its audit event in one transaction.

        The event's detail holds ``state``, ``previous`` and ``reason``. Setting the state a
        runtime is in already records the new reason and actor (and the event) but keeps
        ``since``. ValueError for a state outside :data:`RUNTIME_STATES`.
        """
        check_runtime(runtime)
        check_state(state)
        params: dict[str, Any] = {"runtime": runtime, "state": state, "reason": reason}
        params |= {"actor": actor, "now": self._clock.now()}
        return await self._transact(_set_state(self._codec, params))

    async def runtime_states(self) -> dict[str, RuntimeState]:
        """Every stored runtime state by runtime id (a runtime absent here is enabled)."""
        found = await self._query(rows(_STATES))
        return {row[0]: read(self._codec, RuntimeState, row) for row in found}

    async def last_submit(self, runtime: str) -> LastSubmit | None:
        """``runtime``'s newest submit and what became of it; None when it never had one."""
        return await self._query(_last_submit(self._codec, runtime), single=False)
