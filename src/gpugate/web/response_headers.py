"""Security headers on the responses that browsers may render (issue #15 finding 7).

The console shares its origin with the content the gateway proxies, so an upstream's HTML under
``/u/`` or ``/azure-di/`` must not run as the console's origin, and no other site may frame or
script the console. :class:`SecurityHeaders` is a plain ASGI middleware, the outermost layer of
the app; it adds headers to ``http.response.start`` by path and never touches a body:

* ``/console`` and everything under it: a Content-Security-Policy that allows the console's own
  script and stylesheet only (no inline script or style, no framing: ``frame-ancestors
  'none'``), ``X-Frame-Options: DENY``, ``X-Content-Type-Options: nosniff``,
  ``Referrer-Policy: no-referrer``, ``Cross-Origin-Opener-Policy: same-origin``, and over TLS
  (or behind a declared TLS proxy, ``server.behind_tls_proxy``) ``Strict-Transport-Security``;
* ``/u/...`` and ``/azure-di/...``, proxied content: ``Content-Security-Policy: sandbox`` (a
  page served there runs in a unique origin, without scripts, forms or same-origin access,
  whatever the upstream sent) and ``X-Content-Type-Options: nosniff``;
* ``/admin/...``: ``X-Content-Type-Options: nosniff`` and ``Cache-Control: no-store``.

Every other path (the OpenAI routes, the hot path) passes straight through.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

Headers = tuple[tuple[bytes, bytes], ...]

CONSOLE_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
CONSOLE: Headers = (
    (b"content-security-policy", CONSOLE_CSP.encode()),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"cross-origin-opener-policy", b"same-origin"),
)
HSTS: Headers = ((b"strict-transport-security", b"max-age=31536000"),)
PROXIED: Headers = (
    (b"content-security-policy", b"sandbox"),
    (b"x-content-type-options", b"nosniff"),
)
ADMIN: Headers = (
    (b"x-content-type-options", b"nosniff"),
    (b"cache-control", b"no-store"),
)
_PROXIED_PREFIXES = ("/u/", "/azure-di/")


def headers_for(path: str, *, tls: bool) -> Headers:
    """The headers a response to ``path`` gets (``tls``: the client reached us over TLS)."""
    if path == "/console" or path.startswith("/console/"):
        return CONSOLE + HSTS if tls else CONSOLE
    if path.startswith(_PROXIED_PREFIXES):
        return PROXIED
    if path.startswith("/admin/"):
        return ADMIN
    return ()


class SecurityHeaders:
    """Adds :func:`headers_for` to every response; see the module docstring.

    ``behind_tls_proxy``: the clients reach us through a proxy that terminates TLS, so a plain
    HTTP connection still counts as TLS for the browser-facing headers.
    """

    def __init__(self, app: ASGIApp, *, behind_tls_proxy: bool = False) -> None:
        self.app = app
        self.behind_tls_proxy = behind_tls_proxy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        tls = self.behind_tls_proxy or scope.get("scheme") == "https"
        extra = headers_for(scope["path"], tls=tls)
        if not extra:
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", ()), *extra]
            await send(message)

        await self.app(scope, receive, send_with_headers)

    def __repr__(self) -> str:
        return f"<SecurityHeaders behind_tls_proxy={self.behind_tls_proxy}>"
