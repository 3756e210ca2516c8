"""The console tests' operator: a cookie-keeping HTTP session that logs in and posts forms."""

from __future__ import annotations

import re
from dataclasses import dataclass

import aiohttp

from gpugate.fleet import FakeExporter
from harness import RunningGateway

TOKEN = "console-admin-token"
ENV = {"GPUGATE_ADMIN_TOKEN": TOKEN}
_CSRF = re.compile(r'name="csrf" value="([0-9a-f]+)"')


@dataclass
class Console:
    """An operator's cookie-keeping HTTP session against ``/console``."""

    http: aiohttp.ClientSession
    gw: RunningGateway
    exporter: FakeExporter

    @property
    def url(self) -> str:
        return self.gw.url + "/console"

    async def login(self, token: str = TOKEN, name: str = "alice") -> aiohttp.ClientResponse:
        form = {"token": token, "name": name, "next": "/console"}
        async with self.http.post(self.url + "/login", data=form, allow_redirects=False) as resp:
            return resp

    async def page(self, path: str = "") -> tuple[int, str]:
        async with self.http.get(self.url + path, allow_redirects=False) as resp:
            return resp.status, await resp.text()

    async def csrf(self) -> str:
        _, text = await self.page()
        found = _CSRF.search(text)
        assert found is not None, "no CSRF token on the page"
        return found.group(1)

    async def post(
        self, path: str, form: dict[str, str] | None = None, *, csrf: bool = True
    ) -> tuple[int, str, str]:
        """POST a console form; (status, Location, body)."""
        data = dict(form or {})
        if csrf:
            data["csrf"] = await self.csrf()
        async with self.http.post(self.url + path, data=data, allow_redirects=False) as resp:
            return resp.status, resp.headers.get("Location", ""), await resp.text()
