"""The audit trail in SQLite: one insert (used inside other writes' transactions) and one query."""

from __future__ import annotations

import json
from datetime import datetime
from typing import TYPE_CHECKING, Any

from gpugate.store.base import AUDIT_FILTERS, AuditEvent, AuditRecord
from gpugate.store.sqlite_codec import json_text, text_time, time_text

if TYPE_CHECKING:
    import sqlite3

_AUDIT_COLUMNS = "id, at, actor, action, subject, detail"
_INSERT_AUDIT = f"""
INSERT INTO audit_events (at, actor, action, subject, detail)
VALUES (:at, :actor, :action, :subject, :detail)
RETURNING {_AUDIT_COLUMNS}"""  # noqa: S608 -- constants only; values are bound
_FILTERS = tuple((name, f"{cond} :{name}") for name, cond in AUDIT_FILTERS)


def insert_audit(conn: sqlite3.Connection, at: str, event: AuditEvent) -> AuditRecord:
    """Append ``event`` at ``at`` (time text) on ``conn``, inside the caller's transaction."""
    params = {"at": at, "actor": event.actor, "action": event.action, "subject": event.subject}
    params["detail"] = json_text(event.detail)
    return audit_record(conn.execute(_INSERT_AUDIT, params).fetchone())


def audit_query(filters: dict[str, object], limit: int) -> tuple[str, dict[str, Any]]:
    """The SELECT of a page of audit events, newest first, with the filters that are set."""
    params = {name: value for name, value in filters.items() if value is not None}
    since = params.get("since")
    if isinstance(since, datetime):
        params["since"] = time_text(since)
    where = " AND ".join(["1 = 1", *(cond for name, cond in _FILTERS if name in params)])
    params["limit"] = limit
    sql = f"SELECT {_AUDIT_COLUMNS} FROM audit_events WHERE {where} ORDER BY id DESC LIMIT :limit"  # noqa: S608 -- constants only; values are bound
    return sql, params


def audit_record(row: tuple[Any, ...]) -> AuditRecord:
    id_, at, actor, action, subject, detail = row
    return AuditRecord(id_, text_time(at), actor, action, subject, json.loads(detail))
