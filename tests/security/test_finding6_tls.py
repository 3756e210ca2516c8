"""Finding 6 (issue #15): no TLS option for ``gpugate serve``: the admin token, the console
session and every prompt crossed the network in the clear.

``tls: {cert_file, key_file, client_ca_file}`` serves HTTPS (TLS 1.2+), and with
``client_ca_file`` requires a client certificate from that CA (mTLS). Real TLS on loopback, with
certificates a throwaway CA issues in the test.
"""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path

import aiohttp
import pytest
from tls_rig import Pki, make_pki, serving_as_serve_does

from console.console_rig import ENV, TOKEN
from gpugate.adapters.gateway_api import GatewayApi, client_tls
from gpugate.config import TlsConfig
from gpugate.errors import ConfigError
from gpugate.server import server_tls
from gpugate.web.console import session
from harness import make_config, upstream


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return make_pki(tmp_path)


def tls_config(dsn: str, pki: Pki, *, mtls: bool = False) -> object:
    return make_config(
        dsn, [upstream("u", ["http://127.0.0.1:9"], ["m"])], tls=pki.tls_block(mtls=mtls)
    )


async def get(url: str, context: ssl.SSLContext | bool) -> int:
    async with aiohttp.ClientSession() as http, http.get(url, ssl=context) as resp:
        return resp.status


async def test_finding6_serve_speaks_tls_with_the_configured_certificate(
    sqlite_dsn: str, pki: Pki
) -> None:
    async with serving_as_serve_does(tls_config(sqlite_dsn, pki), environ=ENV) as gw:
        verified = await get(gw.url + "/healthz", pki.client_context())
        plain = gw.url.replace("https://", "http://") + "/healthz"
        with pytest.raises(aiohttp.ClientError):
            await get(plain, False)
    assert gw.url.startswith("https://")
    assert 200 == verified


async def test_finding6_with_a_client_ca_every_client_must_present_a_certificate_it_signed(
    sqlite_dsn: str, pki: Pki
) -> None:
    async with serving_as_serve_does(tls_config(sqlite_dsn, pki, mtls=True), environ=ENV) as gw:
        url = gw.url + "/healthz"
        with pytest.raises(aiohttp.ClientError):
            await get(url, pki.client_context())  # no certificate
        with pytest.raises(aiohttp.ClientError):
            await get(url, pki.client_context(pki.stranger_pem))  # another CA's
        admitted = await get(url, pki.client_context(pki.client_pem))
    assert 200 == admitted


async def test_finding6_over_tls_the_console_cookie_is_secure(sqlite_dsn: str, pki: Pki) -> None:
    async with serving_as_serve_does(tls_config(sqlite_dsn, pki), environ=ENV) as gw:
        async with aiohttp.ClientSession() as http:
            form = {"token": TOKEN, "name": "alice", "next": "/console"}
            async with http.post(
                gw.url + "/console/login",
                data=form,
                ssl=pki.client_context(),
                allow_redirects=False,
            ) as resp:
                cookie = resp.headers["Set-Cookie"]
    assert cookie.startswith(f"{session.COOKIE}=")
    assert "secure" in cookie.lower().split("; ")


async def test_finding6_the_cli_talks_to_an_mtls_gateway_with_its_ca_and_certificate(
    sqlite_dsn: str, pki: Pki
) -> None:
    async with serving_as_serve_does(tls_config(sqlite_dsn, pki, mtls=True), environ=ENV) as gw:
        tls = client_tls(str(pki.ca_file), str(pki.client_pem))
        api = GatewayApi(gw.url, token=TOKEN, tls=tls)
        status, body = await asyncio.to_thread(api.request, "GET", "/admin/upstreams")
    assert (200, ["u"]) == (status, [u["id"] for u in body["upstreams"]])


def test_a_tls_file_that_cannot_be_loaded_is_a_config_error_naming_its_key(
    tmp_path: Path,
) -> None:
    missing = str(tmp_path / "nope.pem")
    with pytest.raises(ConfigError) as caught:
        server_tls(TlsConfig(cert_file=missing, key_file=missing))
    assert ["tls.cert_file"] == [problem.path for problem in caught.value.problems]
