"""The console tests' operator: a cookie-keeping HTTP session that logs in and posts forms."""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp

from gpugate.fleet import FakeExporter
from harness import RunningGateway, make_config, model_servers, serving, upstream

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


@contextlib.asynccontextmanager
async def console_of(
    sqlite_dsn: str, exporter: FakeExporter, **gpu_health: Any
) -> AsyncIterator[Console]:
    """A console on a gateway whose upstreams ``a`` and ``b`` run on GPUs 0 and 1 of
    ``exporter`` (``gpu_health`` as given); the monitor polls once at start, then when told."""
    async with model_servers(("a", ["m"]), ("b", ["m"])) as (a, b):
        config = make_config(
            sqlite_dsn,
            [
                upstream("a", [a.url], ["m"], gpu_ids=[0]),
                upstream("b", [b.url], ["m"], gpu_ids=[1]),
            ],
            gpu_health={"dcgm_url": exporter.metrics_url, "poll_s": 3600, **gpu_health},
        )
        async with serving(config, environ=ENV) as gw:
            jar = aiohttp.CookieJar(unsafe=True)  # the gateway is an IP address, 127.0.0.1
            async with aiohttp.ClientSession(cookie_jar=jar) as http:
                yield Console(http, gw, exporter)
