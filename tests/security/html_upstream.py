"""An upstream that answers every request with a small HTML page that tries to read the console:
what a hostile or compromised model server could serve through ``/u/`` or ``/azure-di/``."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from aiohttp import web

PAGE = b"<html><script>fetch('/console').then(r => r.text()).then(alert)</script></html>"


@contextlib.asynccontextmanager
async def html_upstream(status: int = 200) -> AsyncIterator[str]:
    """Serve :data:`PAGE` as ``text/html`` (with ``status``) on a free port; yields its URL."""

    async def page(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=PAGE, status=status, content_type="text/html")

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", page)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()
