"""The listeners of ``serve`` with two workers: TLS on both, and ``admin_listen`` still keeping
the admin plane on its own port (each worker binds both with SO_REUSEPORT)."""

from __future__ import annotations

import re
import ssl
from pathlib import Path

import aiohttp
import pytest

from gpugate.fleet import ModelServer
from harness import make_config, upstream
from ports import free_port
from security.tls_rig import make_pki
from workers.processes import serve_process

pytestmark = pytest.mark.e2e

TOKEN = "workers-admin-token"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}


async def _status(url: str, context: ssl.SSLContext, headers: dict[str, str] | None = None) -> int:
    async with aiohttp.ClientSession() as http:  # a fresh connection: either worker
        async with http.get(url, ssl=context, headers=headers) as response:
            return response.status


async def test_two_workers_speak_tls_and_keep_the_admin_plane_on_its_own_listener(
    sqlite_dsn: str, tmp_path: Path
) -> None:
    pki = make_pki(tmp_path)
    admin_port = free_port()
    async with ModelServer(["m"], name="up") as up:
        config = make_config(
            sqlite_dsn,
            [upstream("up", [up.url], ["m"])],
            tls=pki.tls_block(),
            admin_listen=f"127.0.0.1:{admin_port}",
        )
        environ = {"GPUGATE_ADMIN_TOKEN": TOKEN}
        async with serve_process(config, workers=2, environ=environ) as (url, _proc, log):
            first_line = log.read_text().split("\n", 1)[0]
            assert re.search(
                rf"admin plane on https://127\.0\.0\.1:{admin_port} \(2 workers\)", first_line
            )
            assert url.startswith("https://")
            admin = f"https://127.0.0.1:{admin_port}"
            context = pki.client_context()
            for _ in range(6):  # fresh connections reach both workers on both listeners
                assert 200 == await _status(url + "/v1/models", context)
                assert 404 == await _status(url + "/admin/upstreams", context, ADMIN)
                assert 200 == await _status(admin + "/admin/upstreams", context, ADMIN)
                assert 401 == await _status(admin + "/admin/upstreams", context)
                assert 404 == await _status(admin + "/v1/models", context)
            with pytest.raises(aiohttp.ClientError):
                await _status(url.replace("https://", "http://") + "/healthz", context)
