"""Real TLS on loopback: a throwaway CA (trustme) with a server and a client certificate, and a
gateway served the way ``gpugate serve`` serves it (``server_tls``, ``gateway_app``, optional
admin socket), for the TLS and ``admin_listen`` tests."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import trustme

from gpugate.config import GatewayConfig
from gpugate.listen import bind
from gpugate.server import gateway_app, make_server, server_tls
from gpugate.web.app import create_app
from gpugate.web.batches import present
from gpugate.wiring import Gateway, build_gateway


@dataclass(frozen=True)
class Pki:
    """A CA and what it issued, as PEM files."""

    ca_file: Path
    server_pem: Path  # key and chain, for 127.0.0.1 and localhost
    client_pem: Path  # key and chain of a client certificate (mTLS)
    stranger_pem: Path  # a client certificate another CA issued

    def client_context(self, pem: Path | None = None) -> ssl.SSLContext:
        """A client that trusts the CA, presenting ``pem`` (none: no certificate)."""
        context = ssl.create_default_context(cafile=str(self.ca_file))
        if pem is not None:
            context.load_cert_chain(str(pem))
        return context

    def tls_block(self, *, mtls: bool = False) -> dict[str, str]:
        block = {"cert_file": str(self.server_pem), "key_file": str(self.server_pem)}
        if mtls:
            block["client_ca_file"] = str(self.ca_file)
        return block


def make_pki(directory: Path) -> Pki:
    ca, other = trustme.CA(), trustme.CA()
    pki = Pki(
        directory / "ca.pem",
        directory / "server.pem",
        directory / "client.pem",
        directory / "stranger.pem",
    )
    ca.cert_pem.write_to_path(str(pki.ca_file))
    ca.issue_cert("127.0.0.1", "localhost").private_key_and_cert_chain_pem.write_to_path(
        str(pki.server_pem)
    )
    ca.issue_cert("operator@example.com").private_key_and_cert_chain_pem.write_to_path(
        str(pki.client_pem)
    )
    other.issue_cert("mallory@example.com").private_key_and_cert_chain_pem.write_to_path(
        str(pki.stranger_pem)
    )
    return pki


@dataclass(frozen=True)
class Served:
    url: str
    admin_url: str | None
    gateway: Gateway


@contextlib.asynccontextmanager
async def serving_as_serve_does(
    config: GatewayConfig, *, environ: Mapping[str, str], admin: bool = False
) -> AsyncIterator[Served]:
    """The gateway on free loopback ports, with ``config.tls`` and, when ``admin``, a second
    socket for the admin plane, until the block ends."""
    tls = server_tls(config.tls)
    sock = bind("127.0.0.1", 0)
    admin_sock = bind("127.0.0.1", 0) if admin else None
    scheme = "https" if tls is not None else "http"
    async with build_gateway(
        config, environ=environ, probe_interval_s=3600.0, present_error=present
    ) as gateway:
        server = make_server(gateway_app(create_app(gateway), admin_sock), grace_s=1, tls=tls)
        sockets = [sock] if admin_sock is None else [sock, admin_sock]
        task = asyncio.create_task(server.serve(sockets=sockets))
        async with asyncio.timeout(10):
            while not server.started:
                assert not task.done(), "uvicorn did not start"
                await asyncio.sleep(0.01)
        admin_url = None
        if admin_sock is not None:
            admin_url = f"{scheme}://127.0.0.1:{admin_sock.getsockname()[1]}"
        try:
            yield Served(f"{scheme}://127.0.0.1:{sock.getsockname()[1]}", admin_url, gateway)
        finally:
            server.should_exit = True
            await task
