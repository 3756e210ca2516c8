"""The audit trail in PostgreSQL: one insert (used inside other writes' transactions), one query."""

from __future__ import annotations

from datetime import UTC
from typing import TYPE_CHECKING, Any

from psycopg.types.json import Jsonb

from gpugate.errors import StoreError
from gpugate.store.base import AUDIT_FILTERS, AuditEvent, AuditRecord

if TYPE_CHECKING:
    from datetime import datetime

    import psycopg
    from psycopg.rows import TupleRow

    Connection = psycopg.AsyncConnection[TupleRow]

_AUDIT_COLUMNS = "id, at, actor, action, subject, detail"
_INSERT_AUDIT = f"""
INSERT INTO audit_events (at, actor, action, subject, detail)
VALUES (%(at)s, %(actor)s, %(action)s, %(subject)s, %(detail)s)
RETURNING {_AUDIT_COLUMNS}"""  # noqa: S608 -- constants only; values are bound
_FILTERS = tuple((name, f"{cond} %({name})s") for name, cond in AUDIT_FILTERS)


async def insert_audit(conn: Connection, at: datetime, event: AuditEvent) -> AuditRecord:
    """Append ``event`` at ``at`` on ``conn``, inside the caller's transaction."""
    params = {"at": at, "actor": event.actor, "action": event.action, "subject": event.subject}
    params["detail"] = Jsonb(event.detail)
    row = await (await conn.execute(_INSERT_AUDIT, params)).fetchone()
    if row is None:
        raise StoreError("the audit insert returned no row")
    return audit_record(row)


def audit_query(filters: dict[str, object], limit: int) -> tuple[str, dict[str, Any]]:
    """The SELECT of a page of audit events, newest first, with the filters that are set."""
    params = {name: value for name, value in filters.items() if value is not None}
    where = " AND ".join(["true", *(cond for name, cond in _FILTERS if name in params)])
    params["limit"] = limit
    sql = (
        f"SELECT {_AUDIT_COLUMNS} FROM audit_events WHERE {where} ORDER BY id DESC LIMIT %(limit)s"  # noqa: S608 -- constants only; values are bound
    )
    return sql, params


def audit_record(row: TupleRow) -> AuditRecord:
    id_, at, actor, action, subject, detail = row
    return AuditRecord(id_, at.astimezone(UTC), actor, action, subject, detail)
