"""The console's session: a signed cookie after logging in with the admin token, and its CSRF token.

The cookie holds ``{"exp", "who", "nonce"}``, base64url-encoded, and an HMAC-SHA256 of it. The
signing key is derived from the admin token (HMAC of a fixed label), so every replica accepts the
sessions of every other one, and changing the admin token ends every session at once. Logging
out revokes the session on the server too (:mod:`.revocations`: the session's id, a hash of its
nonce, is recorded in the audit log, which every replica reads), so a copied cookie stops working
at once on that replica and within ``REVOCATION_POLL_S`` on the others. The CSRF token is the
HMAC of the session's nonce under the same key: every console POST must carry it (form field
``csrf`` or header ``X-CSRF-Token``).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
from dataclasses import dataclass

COOKIE = "gpugate_console"
COOKIE_PATH = "/console"
SESSION_S = 8 * 3600
_LABEL = b"gpugate console session v1"


@dataclass(frozen=True, slots=True)
class Session:
    """A logged-in operator: who (for the audit log), until when, and the CSRF token."""

    who: str
    expires: float
    csrf: str
    sid: str  # the session's id: a hash of its nonce (what a logout revokes; not a secret)

    @property
    def actor(self) -> str:
        """The audit log's actor: ``console`` or ``console:<name>``."""
        return f"console:{self.who}" if self.who else "console"


def _key(admin_token: str) -> bytes:
    return hmac.new(admin_token.encode(), _LABEL, hashlib.sha256).digest()


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _csrf(key: bytes, nonce: str) -> str:
    return hmac.new(key, b"csrf|" + nonce.encode(), hashlib.sha256).hexdigest()


def issue(admin_token: str, who: str, now: float) -> str:
    """A new session cookie's value for ``who``, valid for ``SESSION_S`` from ``now``."""
    payload = json.dumps(
        {"exp": now + SESSION_S, "who": who, "nonce": secrets.token_urlsafe(16)},
        separators=(",", ":"),
    ).encode()
    signature = hmac.new(_key(admin_token), payload, hashlib.sha256).digest()
    return f"{_b64(payload)}.{_b64(signature)}"


def verify(admin_token: str | None, value: str | None, now: float) -> Session | None:
    """The session in a cookie's value, or None when absent, forged, malformed or expired."""
    if admin_token is None or not value or value.count(".") != 1:
        return None
    key = _key(admin_token)
    encoded, signature = value.split(".")
    try:
        payload, offered = _unb64(encoded), _unb64(signature)
    except ValueError:
        return None
    if not hmac.compare_digest(hmac.new(key, payload, hashlib.sha256).digest(), offered):
        return None
    try:
        data = json.loads(payload)
        expires, who, nonce = float(data["exp"]), str(data["who"]), str(data["nonce"])
    except (ValueError, KeyError, TypeError):
        return None
    if expires <= now:
        return None
    sid = hashlib.sha256(b"sid|" + nonce.encode()).hexdigest()[:32]
    return Session(who=who, expires=expires, csrf=_csrf(key, nonce), sid=sid)


def csrf_ok(session: Session, offered: str | None) -> bool:
    """Whether ``offered`` is this session's CSRF token (constant time)."""
    return offered is not None and hmac.compare_digest(session.csrf.encode(), offered.encode())
