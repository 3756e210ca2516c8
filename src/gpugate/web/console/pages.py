"""The console's handlers: parse the request, check the session, call a view or an operation,
render. GET pages redirect to the login page without a session; POST actions also need the
session's CSRF token and answer 303 to the page they came from, with a notice.

A GET page also answers a request that carries the admin token itself
(``Authorization: Bearer``, checked as the admin API checks it, throttle included), as DESIGN
§3 lists the console under the operator plane's credential: read-only, since such a visit has
no session and so no CSRF token for the page's forms. A wrong token there is a 401, not the
login page."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, quote, urlencode

from starlette.responses import HTMLResponse, RedirectResponse, Response

from gpugate.errors import (
    BadRequest,
    ClientError,
    ConfigError,
    CsrfRejected,
    GpugateError,
    TooManyAttempts,
    Unauthorized,
)
from gpugate.services.config_preview import ConfigPreview, media_of
from gpugate.web.admin import clear_gpu_fault, throttled_match, valid_actor_name
from gpugate.web.admin_config import exported
from gpugate.web.admin_runtimes import MAX_REASON, VERBS
from gpugate.web.api import authorize_admin
from gpugate.web.bodies import read_body, refuse_unstorable
from gpugate.web.console import session, views
from gpugate.web.console.revocations import Revocations
from gpugate.web.errors import error_headers, status_of

if TYPE_CHECKING:
    from starlette.requests import Request

    from gpugate.web.console.templates import Templates
    from gpugate.wiring import Gateway

CSRF_HEADER = "x-csrf-token"
REFRESH_MS = 3000
_TRANSIENT = frozenset({"fragment", "notice", "error"})  # query keys a page does not keep

Page = Callable[["Request", "Gateway", session.Session], Awaitable[Response]]
BEARER = session.Session(who="", expires=float("inf"), csrf="", sid="")  # see the docstring


def _gateway(request: Request) -> Gateway:
    gateway: Gateway = request.app.state.gateway
    return gateway


def _safe_next(raw: str | None) -> str:
    """Only a console path is a place to go back to (no open redirect)."""
    if raw and raw.startswith("/console") and "//" not in raw and "\\" not in raw:
        return raw
    return "/console"


def _over_tls(request: Request, gateway: Gateway) -> bool:
    """Whether the browser reached us over TLS: served with ``tls``, or behind a TLS proxy
    the config declares (``server.behind_tls_proxy``); the session cookie is then Secure."""
    return request.url.scheme == "https" or gateway.config.server.behind_tls_proxy


def _login_redirect(request: Request) -> Response:
    here = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return RedirectResponse(f"/console/login?next={quote(here)}", status_code=303)


async def _form(request: Request, gateway: Gateway) -> dict[str, str]:
    """A urlencoded form body (the console's forms send nothing else), last value per name."""
    raw = await read_body(request, gateway.config.server.max_body_bytes)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadRequest("the form is not UTF-8") from exc
    return {k: v[-1] for k, v in parse_qs(text, keep_blank_values=True).items()}


def _done(form: dict[str, str], notice: str, *, error: bool = False) -> Response:
    target = _safe_next(form.get("next"))
    sep = "&" if "?" in target else "?"
    key = "error" if error else "notice"
    return RedirectResponse(f"{target}{sep}{urlencode({key: notice})}", status_code=303)


class Pages:
    """Every console route; ``templates`` renders them."""

    def __init__(self, templates: Templates) -> None:
        self._templates = templates
        self._revocations = Revocations()
        self.overview = self._page(self._overview)
        self.runtimes = self._page(self._runtimes)
        self.runtime = self._page(self._runtime)
        self.jobs = self._page(self._jobs)
        self.job = self._page(self._job)
        self.audit = self._page(self._audit)
        self.usage = self._page(self._usage)
        self.config = self._page(self._config)
        self.export_config = self._page(self._export_config)
        self.logout = self._action(self._logout)
        self.runtime_verb = self._action(self._runtime_verb)
        self.clear_gpu = self._action(self._clear_gpu)
        self.preview_config = self._action(self._preview_config)
        self.import_config = self._action(self._import_config)
        self.rollback_config = self._action(self._rollback_config)

    # -- plumbing -----------------------------------------------------------------------------

    async def _session(self, request: Request, gateway: Gateway) -> session.Session | None:
        """The request's session: signed, unexpired, and not logged out on any replica."""
        now = gateway.clock.now()
        cookie = request.cookies.get(session.COOKIE)
        who = session.verify(gateway.admin_token, cookie, now.timestamp())
        if who is None:
            return None
        await self._revocations.refresh(gateway.store, now, gateway.clock.monotonic())
        return None if self._revocations.revoked(who) else who

    def _html(
        self,
        request: Request,
        name: str,
        context: dict[str, Any],
        who: session.Session | None,
        status: int = 200,
    ) -> Response:
        q = request.query_params
        kept = urlencode([(k, v) for k, v in q.multi_items() if k not in _TRANSIENT])
        full = {
            "csrf": who.csrf if who else "",
            "who": who.actor if who else "",
            "here": request.url.path + (f"?{kept}" if kept else ""),
            "path": request.url.path,
            "notice": q.get("notice"),
            "error": q.get("error"),
            "refresh_ms": REFRESH_MS,
            **context,
        }
        fragment = q.get("fragment") == "1"
        text = self._templates.render(name, full, fragment=fragment)
        return HTMLResponse(text, status_code=status, headers={"Cache-Control": "no-store"})

    def _page(self, handler: Page) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            gateway = _gateway(request)
            who = await self._session(request, gateway)
            if who is None and "authorization" in request.headers:
                try:
                    authorize_admin(request, gateway)
                except ClientError as exc:
                    context = {"code": exc.code, "message": exc.message}
                    page = self._html(request, "error.html", context, None, status_of(exc))
                    page.headers.update(error_headers(exc))
                    return page
                who = BEARER
            if who is None:
                if request.query_params.get("fragment") == "1":
                    return Response("session expired", status_code=401)
                return _login_redirect(request)
            try:
                refuse_unstorable({**request.path_params, **request.query_params})
                return await handler(request, gateway, who)
            except ClientError as exc:
                context = {"code": exc.code, "message": exc.message}
                return self._html(request, "error.html", context, who, status=status_of(exc))

        return endpoint

    def _action(self, handler: Page) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            gateway = _gateway(request)
            who = await self._session(request, gateway)
            if who is None:
                raise Unauthorized("no console session: log in at /console/login")
            form = await _form(request, gateway)
            offered = form.get("csrf") or request.headers.get(CSRF_HEADER)
            if not session.csrf_ok(who, offered):
                raise CsrfRejected("missing or wrong CSRF token: reload the page and try again")
            request.state.form = form
            try:
                refuse_unstorable({**request.path_params, **form})
                return await handler(request, gateway, who)
            except ClientError as exc:
                return _done(form, f"{exc.code}: {exc.message}", error=True)

        return endpoint

    # -- login --------------------------------------------------------------------------------

    async def login_form(self, request: Request) -> Response:
        gateway = _gateway(request)
        context = {"next": _safe_next(request.query_params.get("next")), "problem": None}
        if gateway.admin_token is None:
            context["problem"] = "The console is off: no admin token is configured."
        return self._html(request, "login.html", context, None)

    async def login(self, request: Request) -> Response:
        gateway = _gateway(request)
        form = await _form(request, gateway)
        token, name = gateway.admin_token, form.get("name", "").strip()
        target = _safe_next(form.get("next"))
        offered = form.get("token", "")
        problem, status, wait = None, 401, None
        try:
            if token is None:
                problem = "The console is off: no admin token is configured."
            elif not throttled_match(request, gateway, offered, token):
                problem = "Wrong admin token."
            elif name and not valid_actor_name(name):  # no name: the actor is "console"
                problem = "A name is up to 64 letters, digits, '.', '_', '@' or '-'."
        except TooManyAttempts as exc:
            problem, status, wait = exc.message, 429, exc
        if problem is not None:
            context = {"next": target, "problem": problem}
            page = self._html(request, "login.html", context, None, status=status)
            if wait is not None:
                page.headers.update(error_headers(wait))
            return page
        assert token is not None  # a problem above otherwise
        now = gateway.clock.now().timestamp()
        response = RedirectResponse(target, status_code=303)
        response.set_cookie(
            session.COOKIE,
            session.issue(token, name, now),
            max_age=session.SESSION_S,
            path=session.COOKIE_PATH,
            httponly=True,
            samesite="strict",
            secure=_over_tls(request, gateway),
        )
        return response

    async def _logout(self, request: Request, gateway: Gateway, who: session.Session) -> Response:
        await self._revocations.revoke(gateway.store, who, who.actor)
        response = RedirectResponse("/console/login", status_code=303)
        response.delete_cookie(
            session.COOKIE,
            path=session.COOKIE_PATH,
            httponly=True,
            samesite="strict",
            secure=_over_tls(request, gateway),
        )
        return response

    # -- pages --------------------------------------------------------------------------------

    async def _overview(self, request: Request, gateway: Gateway, who: session.Session) -> Response:
        return self._html(request, "overview.html", await views.overview(gateway), who)

    async def _runtimes(self, request: Request, gateway: Gateway, who: session.Session) -> Response:
        context = {"runtimes": await views.runtimes(gateway)}
        return self._html(request, "runtimes.html", context, who)

    async def _runtime(self, request: Request, gateway: Gateway, who: session.Session) -> Response:
        context = await views.runtime(gateway, request.path_params["runtime"])
        return self._html(request, "runtime.html", context, who)

    async def _jobs(self, request: Request, gateway: Gateway, who: session.Session) -> Response:
        q = request.query_params
        context = await views.jobs(
            gateway,
            state=q.get("state") or None,
            runner=q.get("runner") or None,
            cursor=q.get("cursor") or None,
        )
        return self._html(request, "jobs.html", context, who)

    async def _job(self, request: Request, gateway: Gateway, who: session.Session) -> Response:
        context = await views.job(gateway, request.path_params["slug"])
        return self._html(request, "job.html", context, who)

    async def _audit(self, request: Request, gateway: Gateway, who: session.Session) -> Response:
        q = request.query_params
        filters = {k: q.get(k, "").strip() for k in ("action", "subject", "actor", "since")}
        context = await views.audit(gateway, filters, q.get("cursor") or None)
        return self._html(request, "audit.html", context, who)

    async def _usage(self, request: Request, gateway: Gateway, who: session.Session) -> Response:
        q = request.query_params
        filters = {k: q.get(k, "").strip() for k in ("tenant", "key", "model", "from", "to")}
        return self._html(request, "usage.html", await views.usage(gateway, filters), who)

    async def _config(self, request: Request, gateway: Gateway, who: session.Session) -> Response:
        context = {**await views.config(gateway), "preview": None, "proposed": ""}
        return self._html(request, "config.html", context, who)

    async def _export_config(
        self, request: Request, gateway: Gateway, who: session.Session
    ) -> Response:
        return await exported(gateway, "yaml", download=True)

    # -- actions ------------------------------------------------------------------------------

    async def _runtime_verb(
        self, request: Request, gateway: Gateway, who: session.Session
    ) -> Response:
        form: dict[str, str] = request.state.form
        verb, runtime = request.path_params["verb"], request.path_params["runtime"]
        if verb not in VERBS:
            raise BadRequest(f"unknown action {verb!r} (one of {', '.join(VERBS)})")
        reason = form.get("reason", "").strip()[:MAX_REASON]
        stored = await gateway.runtime_ops.set_state(runtime, VERBS[verb], reason, who.actor)
        return _done(form, f"Runtime {runtime} is {stored.state}.")

    async def _clear_gpu(
        self, request: Request, gateway: Gateway, who: session.Session
    ) -> Response:
        form: dict[str, str] = request.state.form
        gpu = request.path_params["gpu"]
        cleared = await clear_gpu_fault(gateway, gpu, who.actor)
        what = ", ".join(cleared) if cleared else "no held fault"
        return _done(form, f"GPU {gpu} cleared ({what}).")

    async def _preview_config(
        self, request: Request, gateway: Gateway, who: session.Session
    ) -> Response:
        form: dict[str, str] = request.state.form
        text = form.get("document", "")
        preview = await ConfigPreview(
            gateway.store, lambda: (gateway.config, gateway.config_version), gateway.import_environ
        ).preview(text)
        context = {
            **await views.config(gateway),
            "preview": preview,
            "proposed": text,
            "here": "/console/config",
        }
        status = 200 if preview.valid else 422
        return self._html(request, "config.html", context, who, status=status)

    async def _import_config(
        self, request: Request, gateway: Gateway, who: session.Session
    ) -> Response:
        form: dict[str, str] = request.state.form
        text = form.get("document", "")
        try:
            result = await gateway.config_versions.import_text(
                text, media=media_of(text), actor=who.actor
            )
        except ConfigError as exc:
            return _done(form, f"Import refused: {len(exc.problems)} problem(s).", error=True)
        if not result.changed:
            return _done(form, f"No change: version {result.version} stays in effect.")
        return _done(form, f"Imported as version {result.version}, in effect now.")

    async def _rollback_config(
        self, request: Request, gateway: Gateway, who: session.Session
    ) -> Response:
        form: dict[str, str] = request.state.form
        target: int = request.path_params["version"]
        try:
            result = await gateway.config_versions.rollback(target, actor=who.actor)
        except GpugateError as exc:
            return _done(form, f"Rollback refused: {exc.message}", error=True)
        return _done(form, f"Rolled back to version {target}: now version {result.version}.")

    def __repr__(self) -> str:
        return f"<Pages {self._templates!r}>"
