"""The console's routes (``/console``, server-rendered HTML), documented here so that the
OpenAPI document lists every route of the app and the fuzz reaches them too.

Pages answer HTML, or redirect (303) to the login page without a session; actions (POST) need
the session's CSRF token (form field ``csrf`` or header ``X-CSRF-Token``) and answer a 303 back
to the page they came from.
"""

from __future__ import annotations

from dataclasses import replace

from pydantic import BaseModel, Field

from gpugate.web.schemas.common import Query
from gpugate.web.schemas.operation import Answer, Operation, RawBody, Security, Spec

HTML = {"type": "string", "description": "an HTML page"}
_PAGE = Answer("the page", media="text/html", schema=HTML)
_TO_LOGIN = Answer("no session: to the login page (`?next=` this page)", media="text/html")
_PAGES = ("text/html", "application/json")  # pages, and the refusals made before a page
_BACK = Answer("done (or refused, with the reason): back to the page", media="text/html")


class PageQuery(Query):
    fragment: str | None = Field(None, description="`1`: only the live region (polling)")
    notice: str | None = None
    error: str | None = None


class JobsPageQuery(PageQuery):
    state: str | None = None
    runner: str | None = None
    cursor: str | None = None


class AuditPageQuery(PageQuery):
    action: str | None = None
    subject: str | None = None
    actor: str | None = None
    since: str | None = None
    cursor: str | None = None


class UsagePageQuery(PageQuery):
    """The usage page's filters: as ``GET /admin/usage`` (``from``/``to`` are UTC days)."""

    tenant: str | None = None
    key: str | None = None
    model: str | None = None
    since: str | None = Field(None, alias="from")
    until: str | None = Field(None, alias="to")


class LoginQuery(Query):
    next: str | None = Field(None, description="where to go after logging in (a console path)")


class LoginForm(BaseModel):
    token: str = Field(description="the admin token")
    name: str | None = Field(None, description="your name for the audit log")
    next: str | None = None


class ActionForm(BaseModel):
    csrf: str | None = Field(None, description="the session's CSRF token (or X-CSRF-Token)")
    next: str | None = Field(None, description="the page to go back to")
    reason: str | None = Field(None, description="enable/disable/drain: why")
    document: str | None = Field(None, description="config preview/import: the document")


class RuntimePagePath(Query):
    runtime: str


class RuntimeVerbPath(RuntimePagePath):
    verb: str = Field(examples=["enable", "disable", "drain"])


class JobPagePath(Query):
    slug: str


class GpuPagePath(Query):
    gpu: str


class VersionPagePath(Query):
    version: int


class StaticPath(Query):
    path: str = Field(pattern=r"^[A-Za-z0-9._-]+\.(css|js)$", examples=["console.css"])


def _page(
    summary: str, query: type[BaseModel] = PageQuery, path: type[BaseModel] | None = None
) -> Spec:
    return Spec(
        summary=summary,
        security=Security.CONSOLE,
        tags=("console",),
        responses={200: _PAGE, 303: _TO_LOGIN},
        errors={
            400: "BAD_REQUEST: a filter the page cannot use",
            404: "UNKNOWN_RUNTIME, JOB_NOT_FOUND, NOT_FOUND",
        },
        query=query,
        path=path,
        error_media=_PAGES,
    )


_FORM = RawBody({"application/x-www-form-urlencoded": ActionForm})


def _action(summary: str, path: type[BaseModel] | None = None) -> Spec:
    return Spec(
        summary=summary,
        security=Security.CONSOLE,
        tags=("console",),
        responses={303: _BACK},
        errors={
            401: "UNAUTHORIZED: no console session",
            403: "CSRF_REJECTED: the session's CSRF token is missing or wrong",
            404: "NOT_FOUND: a path parameter of the wrong form",
        },
        body=_FORM,
        path=path,
        error_media=_PAGES,
    )


_LOGIN = Spec(
    summary="Log in with the admin token: a session cookie, and back to `next`",
    tags=("console",),
    responses={
        303: Answer("logged in: to `next`", media="text/html"),
        401: Answer("the login page again, saying what was wrong", media="text/html", schema=HTML),
    },
    body=RawBody({"application/x-www-form-urlencoded": LoginForm}),
    errors={429: "TOO_MANY_ATTEMPTS: too many wrong tokens from this client (Retry-After)"},
    error_media=_PAGES,
)

OPERATIONS = (
    Operation("get", "/console", _page("The overview: runtimes, GPUs, upstreams, recent events")),
    Operation(
        "get",
        "/console/login",
        replace(_page("The login page"), security=Security.NONE, query=LoginQuery),
    ),
    Operation("post", "/console/login", _LOGIN),
    Operation("post", "/console/logout", _action("Log out: the session cookie is cleared")),
    Operation("get", "/console/runtimes", _page("Every runtime, with its actions")),
    Operation(
        "get", "/console/runtimes/{runtime}", _page("One runtime in detail", path=RuntimePagePath)
    ),
    Operation(
        "post",
        "/console/runtimes/{runtime}/{verb}",
        _action("Enable, disable or drain a runtime", path=RuntimeVerbPath),
    ),
    Operation(
        "post", "/console/gpus/{gpu}/clear", _action("Clear a GPU's held fault", path=GpuPagePath)
    ),
    Operation("get", "/console/jobs", _page("Jobs, filtered", query=JobsPageQuery)),
    Operation("get", "/console/jobs/{slug}", _page("One job and its events", path=JobPagePath)),
    Operation("get", "/console/audit", _page("The audit log, filtered", query=AuditPageQuery)),
    Operation(
        "get",
        "/console/usage",
        _page("Tokens and cents per day, key and tenant", query=UsagePageQuery),
    ),
    Operation("get", "/console/config", _page("The config in effect, its versions, an import")),
    Operation(
        "get",
        "/console/config/export",
        replace(
            _page("The config in effect as a YAML download"),
            responses={
                200: Answer("gateway.v<version>.yaml", media="application/yaml", schema={}),
                303: _TO_LOGIN,
            },
        ),
    ),
    Operation(
        "post",
        "/console/config/preview",
        replace(
            _action("A config document's diff and problems"),
            responses={
                200: Answer("the diff against the version in effect", media="text/html"),
                303: _BACK,
                422: Answer("the document's problems", media="text/html", schema=HTML),
            },
        ),
    ),
    Operation("post", "/console/config/import", _action("Import a config document")),
    Operation(
        "post",
        "/console/config/rollback/{version}",
        _action("Roll the config back to a version", path=VersionPagePath),
    ),
    Operation(
        "get",
        "/console/static/{path}",
        Spec(
            summary="The console's stylesheet and scripts",
            tags=("console",),
            responses={200: Answer("the file", media="text/css", schema={"type": "string"})},
            errors={404: "no such file"},
            path=StaticPath,
            uses_store=False,
        ),
    ),
)
