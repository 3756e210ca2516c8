"""Who holds a job: the typed lease (issue #17), stored as columns, never parsed from text.

A leased job (``dispatching``/``running``) is held by exactly one of:

* a **claim** — a dispatcher of one replica took it from the queue (``replica`` names it);
* a **reservation** — that dispatcher took a call slot of ``runtime`` (and maybe budget) for it
  and is about to submit;
* a **call** — ``runtime`` accepted it as ``call_id``.

The store keeps the lease as the columns ``lease_kind``, ``lease_runtime``, ``lease_call_id``
and ``lease_replica``, and SQL asks those (how many calls a runtime holds, which claims a silent
replica held). ``leased_by`` is still written beside them for people and old readers
(:meth:`Lease.text`), but nothing parses it.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

CLAIM_MARK = "-dispatcher@"
"""Between a claimed job's slug and its replica in the ``leased_by`` text."""

RESERVED_CALL = "~reserved"
"""The call id :attr:`Lease.call` shows for a reservation (its submit is not recorded yet)."""


class LeaseKind(StrEnum):
    CLAIM = "claim"
    RESERVATION = "reservation"
    CALL = "call"


@dataclass(frozen=True, slots=True)
class Lease:
    """A job's holder; build one with :meth:`claim`, :meth:`reservation` or :meth:`of_call`."""

    kind: LeaseKind
    runtime: str | None = None
    call_id: str | None = None
    replica: str | None = None

    @classmethod
    def claim(cls, replica: str | None) -> Lease:
        return cls(LeaseKind.CLAIM, replica=replica)

    @classmethod
    def reservation(cls, runtime: str, replica: str | None = None) -> Lease:
        return cls(LeaseKind.RESERVATION, runtime=runtime, replica=replica)

    @classmethod
    def of_call(cls, runtime: str, call_id: str, replica: str | None = None) -> Lease:
        """``replica``: the process the call runs in, when it runs in one (an ``upstream``
        runtime's call lives and dies with its replica); None for a call a worker or a
        serverless platform runs, which any replica can ask about."""
        return cls(LeaseKind.CALL, runtime=runtime, call_id=call_id, replica=replica)

    @property
    def call(self) -> tuple[str, str] | None:
        """``(runtime, call_id)`` when a runtime holds the job or a slot of it is reserved
        (call id :data:`RESERVED_CALL`), None for a dispatcher's claim."""
        if self.kind is LeaseKind.CLAIM or self.runtime is None:
            return None
        return self.runtime, self.call_id or RESERVED_CALL

    def text(self, slug: str) -> str:
        """The ``leased_by`` shown: ``<slug>-dispatcher@<replica>`` or ``<runtime>:<call_id>``."""
        call = self.call
        return f"{slug}{CLAIM_MARK}{self.replica}" if call is None else f"{call[0]}:{call[1]}"

    def columns(self) -> dict[str, str | None]:
        """The lease's stored columns (by their :class:`JobRecord` field names)."""
        return {
            "lease_kind": self.kind.value,
            "lease_runtime": self.runtime,
            "lease_call_id": self.call_id,
            "lease_replica": self.replica,
        }


NO_LEASE_COLUMNS: dict[str, None] = dict.fromkeys(
    ("lease_kind", "lease_runtime", "lease_call_id", "lease_replica")
)


def stored_lease(
    kind: str | None, runtime: str | None, call_id: str | None, replica: str | None
) -> Lease | None:
    """The lease of a row's lease columns, None when the job is not leased."""
    return None if kind is None else Lease(LeaseKind(kind), runtime, call_id, replica)
