"""The audit trail: one insert (a step of other writes' transactions too) and one query."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from gpugate.store.base import AuditEvent, AuditRecord, check_limit
from gpugate.store.dialect import Json, sql
from gpugate.store.tx import Driven, one, read, rows

if TYPE_CHECKING:
    from datetime import datetime

    from gpugate.store.tx import Codec, Tx

_INSERT = sql("""
INSERT INTO audit_events (at, actor, action, subject, detail)
VALUES (:at, :actor, :action, :subject, :detail)
RETURNING id, at, actor, action, subject, detail""")
# Every filter given must hold; one that is not given (NULL) holds for every row.
_LIST = sql("""
SELECT id, at, actor, action, subject, detail FROM audit_events
WHERE (:action::text IS NULL OR action = :action)
  AND (:subject::text IS NULL OR subject = :subject)
  AND (:actor::text IS NULL OR actor = :actor)
  AND (:since::timestamptz IS NULL OR at >= :since)
  AND (:before_id::bigint IS NULL OR id < :before_id)
ORDER BY id DESC LIMIT :limit""")


def insert_audit(c: Codec, at: datetime, event: AuditEvent) -> Tx[AuditRecord]:
    """Append ``event`` at ``at``, inside the caller's transaction."""
    params = {"at": at, "actor": event.actor, "action": event.action, "subject": event.subject}
    return read(c, AuditRecord, (yield from one(_INSERT, params | {"detail": Json(event.detail)})))


class AuditStore(Driven, Protocol):
    """The audit trail of :class:`gpugate.store.Store`."""

    async def append_audit(self, event: AuditEvent) -> AuditRecord:
        """Store one audit event."""
        return await self._transact(insert_audit(self._codec, self._clock.now(), event))

    async def list_audit(
        self,
        *,
        action: str | None = None,
        subject: str | None = None,
        limit: int = 100,
        before_id: int | None = None,
        actor: str | None = None,
        since: datetime | None = None,
    ) -> list[AuditRecord]:
        """Audit events, newest first, optionally filtered (every filter given must hold;
        ``since`` keeps events at or after that time); ``before_id`` pages further back."""
        params: dict[str, Any] = {"action": action, "subject": subject, "actor": actor}
        params |= {"since": since, "before_id": before_id, "limit": check_limit(limit)}
        found = await self._query(rows(_LIST, params))
        return [read(self._codec, AuditRecord, row) for row in found]
