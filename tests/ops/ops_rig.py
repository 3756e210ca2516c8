"""Helpers of the operator-plane tests: an admin client of a running gateway."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp

TOKEN = "s3cret-admin-token"
ENV = {"GPUGATE_ADMIN_TOKEN": TOKEN}


@dataclass
class Reply:
    """One answer of the admin API: status, headers, raw text and (when JSON) the body."""

    status: int
    headers: Mapping[str, str]  # case-insensitive
    text: str
    body: Any

    @property
    def code(self) -> str | None:
        return (
            (self.body or {}).get("error", {}).get("code") if isinstance(self.body, dict) else None
        )


@dataclass
class Admin:
    """``/admin/...`` requests with the admin token (or another ``token``), as an operator."""

    http: aiohttp.ClientSession
    url: str
    token: str | None = TOKEN
    actor: str | None = "alice"

    async def call(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        data: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> Reply:
        sent = dict(headers or {})
        if self.token is not None:
            sent["Authorization"] = f"Bearer {self.token}"
        if self.actor is not None:
            sent["X-Gpugate-Actor"] = self.actor
        async with self.http.request(
            method, self.url + path, json=json, data=data, headers=sent
        ) as resp:
            text = await resp.text()
            body = await resp.json(content_type=None) if "json" in resp.content_type else None
            return Reply(resp.status, resp.headers.copy(), text, body)

    async def export(self, *, yaml: bool = False) -> Reply:
        headers = {"Accept": "application/yaml"} if yaml else {}
        return await self.call("GET", "/admin/config", headers=headers)

    async def import_text(self, text: str, *, yaml: bool = False) -> Reply:
        kind = "application/yaml" if yaml else "application/json"
        return await self.call("PUT", "/admin/config", data=text, headers={"Content-Type": kind})
