"""Console sessions revoked by logging out, shared by every replica through the audit log.

A session is a signed cookie (:mod:`.session`), valid on every replica until it expires; a
logout must end it everywhere. :meth:`Revocations.revoke` appends a ``console.logout`` audit
event naming the session's id and its expiry — the audit log is in the store every replica
shares, and the event is worth having anyway — and remembers the id here at once.
:meth:`Revocations.refresh` reads the logouts other replicas recorded, at most every
``poll_s``, when a console request arrives (no loop runs for an idle console).

Memory is bounded: an id is forgotten when its session would have expired anyway, and at most
``max_entries`` are kept (the ones expiring first go first; each is a logout, which needs the
admin token, so this bounds an admin's mistakes, not an outsider's traffic).
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from gpugate.store import AuditEvent
from gpugate.web.console.session import SESSION_S

if TYPE_CHECKING:
    from gpugate.store import Store
    from gpugate.web.console.session import Session

ACTION = "console.logout"
SUBJECT = "console-session:"
REVOCATION_POLL_S = 2.0


class Revocations:
    """The ids of the sessions logged out, until they would have expired; see the module doc."""

    def __init__(self, *, poll_s: float = REVOCATION_POLL_S, max_entries: int = 10_000) -> None:
        self._poll_s = poll_s
        self._max = max_entries
        self._expires: dict[str, float] = {}  # sid -> the session's expiry (epoch seconds)
        self._read_until: datetime | None = None  # audit events at or after this are unread
        self._next_read = 0.0  # monotonic time of the next read of the audit log
        self._lock = asyncio.Lock()

    async def revoke(self, store: Store, session: Session, actor: str) -> None:
        """End ``session`` here at once and, through the audit log, on every replica."""
        self._remember(session.sid, session.expires)
        detail = {"expires": session.expires}
        await store.append_audit(AuditEvent(actor, ACTION, SUBJECT + session.sid, detail))

    async def refresh(self, store: Store, now: datetime, monotonic: float) -> None:
        """Read the logouts recorded since the last read, if ``poll_s`` has passed."""
        if monotonic < self._next_read:
            return
        async with self._lock:
            if monotonic < self._next_read:
                return
            since = self._read_until or now - timedelta(seconds=SESSION_S)
            events = await store.list_audit(action=ACTION, since=since, limit=1000)
            for event in events:
                if event.subject.startswith(SUBJECT):
                    expires = event.detail.get("expires")
                    if isinstance(expires, int | float):
                        self._remember(event.subject.removeprefix(SUBJECT), float(expires))
            self._read_until = max((e.at for e in events), default=since)
            self._next_read = monotonic + self._poll_s
            self._forget_expired(now.timestamp())

    def revoked(self, session: Session) -> bool:
        return session.sid in self._expires

    def _remember(self, sid: str, expires: float) -> None:
        self._expires[sid] = expires
        if len(self._expires) > self._max:
            for old in sorted(self._expires, key=self._expires.__getitem__)[: -self._max]:
                del self._expires[old]

    def _forget_expired(self, now: float) -> None:
        for sid in [sid for sid, expires in self._expires.items() if expires <= now]:
            del self._expires[sid]

    def __len__(self) -> int:
        return len(self._expires)

    def __repr__(self) -> str:
        return f"<Revocations revoked={len(self._expires)} poll_s={self._poll_s}>"
