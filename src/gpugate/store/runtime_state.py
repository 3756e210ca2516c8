"""What the store keeps of each runtime for the operator plane, and the values it hands back.

* A runtime's operator state — ``enabled``, ``disabled`` or ``drained`` — with why, by whom and
  since when. A runtime without a stored state is enabled. ``set_runtime_state`` writes the
  state and appends its audit event (action ``runtime.<state>``, subject ``runtime:<id>``) in
  ONE transaction, so the audit log is the state's history. Changes the gateway makes on its own
  (stop conditions) use an actor starting with ``gateway`` (:data:`AUTO_ACTOR`), which is how an
  auto-disable is told apart from an operator's.
* A runtime's last submit, read from the job events: when, which job, and what became of it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from datetime import datetime

ENABLED = "enabled"
DISABLED = "disabled"
DRAINED = "drained"
RUNTIME_STATES = (ENABLED, DISABLED, DRAINED)
"""Every operator state of a runtime; only ``enabled`` takes new dispatch."""

AUTO_ACTOR = "gateway"
"""The actor (or actor prefix, ``gateway:<why>``) of a state change the gateway made itself."""

RUNTIME_SUBJECT_PREFIX = "runtime:"


def runtime_subject(runtime: str) -> str:
    """The audit subject of a runtime's events."""
    return RUNTIME_SUBJECT_PREFIX + runtime


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


class RuntimeStateStore(Protocol):
    """The operator-plane part of :class:`gpugate.store.Store`."""

    async def set_runtime_state(
        self, runtime: str, state: str, reason: str, actor: str
    ) -> RuntimeState:
        """Store ``runtime``'s state and append its audit event in one transaction.

        The event's detail holds ``state``, ``previous`` and ``reason``. Setting the state a
        runtime is in already records the new reason and actor (and the event) but keeps
        ``since``. ValueError for a state outside :data:`RUNTIME_STATES`.
        """
        ...

    async def runtime_states(self) -> dict[str, RuntimeState]:
        """Every stored runtime state by runtime id (a runtime absent here is enabled)."""
        ...

    async def last_submit(self, runtime: str) -> LastSubmit | None:
        """``runtime``'s newest submit and what became of it; None when it never had one."""
        ...
