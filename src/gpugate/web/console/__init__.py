"""The web console at ``/console``: server-rendered pages over the operator plane (DESIGN §3).

Log in with the admin token; the session is a signed cookie (HttpOnly, SameSite=Strict,
Path=/console, see :mod:`.session`). Every POST needs the session's CSRF token (else 403
``CSRF_REJECTED``); a page asked for without a session redirects to the login page. The pages
read the same services as the admin API (:mod:`.views`); the actions call the same operations
(runtime states, GPU clear, config import and rollback), audited with the actor
``console[:name]``. Live regions refresh by polling their page with ``?fragment=1``.
"""

from __future__ import annotations

from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from gpugate.web.console.pages import Pages
from gpugate.web.console.templates import Templates


def routes() -> list[BaseRoute]:
    """The console's routes under ``/console`` (and its CSS and JS under ``/console/static``)."""
    pages = Pages(Templates())
    inner: list[BaseRoute] = [
        Route("/login", pages.login_form, methods=["GET"]),
        Route("/login", pages.login, methods=["POST"]),
        Route("/logout", pages.logout, methods=["POST"]),
        Route("/runtimes", pages.runtimes, methods=["GET"]),
        Route("/runtimes/{runtime}", pages.runtime, methods=["GET"]),
        Route("/runtimes/{runtime}/{verb}", pages.runtime_verb, methods=["POST"]),
        Route("/gpus/{gpu:path}/clear", pages.clear_gpu, methods=["POST"]),
        Route("/jobs", pages.jobs, methods=["GET"]),
        Route("/jobs/{slug}", pages.job, methods=["GET"]),
        Route("/audit", pages.audit, methods=["GET"]),
        Route("/usage", pages.usage, methods=["GET"]),
        Route("/config", pages.config, methods=["GET"]),
        Route("/config/export", pages.export_config, methods=["GET"]),
        Route("/config/preview", pages.preview_config, methods=["POST"]),
        Route("/config/import", pages.import_config, methods=["POST"]),
        Route("/config/rollback/{version:int}", pages.rollback_config, methods=["POST"]),
        Mount(
            "/static",
            StaticFiles(packages=[("gpugate.web.console", "static")]),
            name="console-static",
        ),
    ]
    return [Route("/console", pages.overview, methods=["GET"]), Mount("/console", routes=inner)]
