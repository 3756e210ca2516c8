"""Serving an ASGI app: bind first (so a taken port is one clear error), then run uvicorn.

The first SIGTERM or SIGINT starts a drain (:class:`DrainingServer`): ``/readyz`` answers 503 at
once while requests are still served for ``server.drain_delay_s`` (load balancers take seconds
to notice); then uvicorn stops accepting and lets in-flight requests and streams finish within
``server.shutdown_grace_s``; what is left then is answered (503 JSON, or ``event: error`` on a
stream: :mod:`gpugate.web.shutdown`); then the app's lifespan shutdown and the gateway's exit
stop every loop and hand the dispatcher claims back. A second signal stops accepting at once.

TLS (``tls``, :func:`server_tls`) is one server-side context, built before anything else starts
(a wrong file is one error naming its key): TLS 1.2 or newer, Python's default cipher choice,
and with ``client_ca_file`` a client certificate required (mTLS). ``admin_listen`` is a second
socket of the same server; :class:`~gpugate.web.listeners.ListenerSplit` keeps the admin plane
on it and off the main one.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import resource
import signal
import socket
import ssl
import threading
from collections.abc import Awaitable, Callable, Mapping
from types import FrameType

import uvicorn
from starlette.types import ASGIApp

from gpugate.clock import SystemClock
from gpugate.config import GatewayConfig, ServerConfig, SourceMap, TlsConfig
from gpugate.errors import ConfigError, ConfigProblem
from gpugate.services.readiness import Lifecycle
from gpugate.web.app import create_app
from gpugate.web.batches import present
from gpugate.web.collector import IdleCollector
from gpugate.web.connections import ConnectionLimits
from gpugate.web.fastpath import busy, fast_protocol
from gpugate.web.listeners import ListenerSplit, Peers, sibling_metrics
from gpugate.wiring import build_gateway

log = logging.getLogger("gpugate.server")


def raise_fd_limit() -> tuple[int, int]:
    """Raise the soft limit on open files to the hard limit (#14.5: every stream holds two
    sockets; the default soft 1024 runs out long before the CPU does) and log both; returns
    the (soft, hard) limits now in effect. A limit that cannot be raised is logged, not fatal."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError) as exc:
            log.warning("open-file limit stays %d (hard %d): %s", soft, hard, exc)
            return soft, hard
        log.info("open-file limit raised from %d to the hard limit %d", soft, target)
        return target, hard
    log.info("open-file limit %d (hard %d)", soft, hard)
    return soft, hard


def _absorb_reraised_sigterm() -> None:
    """Uvicorn re-raises the signal that stopped it once it has shut down; with the default
    SIGTERM disposition that would kill the process *after* a clean shutdown (exit -15).
    A no-op handler lets the shutdown end in exit code 0, as a supervisor expects."""
    if threading.current_thread() is threading.main_thread() and (
        signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    ):
        signal.signal(signal.SIGTERM, lambda _signum, _frame: None)


def server_tls(tls: TlsConfig | None, lines: SourceMap | None = None) -> ssl.SSLContext | None:
    """The server's TLS context for ``tls`` (None: plain HTTP); :class:`ConfigError` naming
    the key whose file cannot be loaded, and its line in ``lines`` (the config's source map)."""
    if tls is None:
        return None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_alpn_protocols(["http/1.1"])
    try:
        context.load_cert_chain(tls.cert_file, tls.key_file)
    except (OSError, ssl.SSLError) as exc:
        raise _tls_problem("cert_file", "the certificate and key", exc, lines) from exc
    if tls.client_ca_file is not None:
        try:
            context.load_verify_locations(cafile=tls.client_ca_file)
        except (OSError, ssl.SSLError) as exc:
            raise _tls_problem("client_ca_file", "the client CA bundle", exc, lines) from exc
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def _tls_problem(
    key: str, what: str, exc: OSError | ssl.SSLError, lines: SourceMap | None
) -> ConfigError:
    reason = exc.strerror or getattr(exc, "reason", None) or str(exc)
    line = None if lines is None else lines.line(("tls", key))
    return ConfigError([ConfigProblem(f"tls.{key}", f"cannot load {what}: {reason}", line)])


CUT_MARGIN_S = 2.0
"""Uvicorn's own cancellation of what is left comes this long after the grace: a backstop, as
:mod:`gpugate.web.shutdown` answers those requests at the end of the grace."""


class DrainingServer(uvicorn.Server):
    """Uvicorn whose first exit signal drains first (see the module docstring)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        grace_s: float,
        drain_delay_s: float,
        lifecycle: Lifecycle,
        tls: ssl.SSLContext | None = None,
        limits: ConnectionLimits | None = None,
    ) -> None:
        config = _uvicorn_config(app, grace_s + CUT_MARGIN_S, limits or ConnectionLimits())
        super().__init__(_with_tls(config, tls))
        self._grace_s = grace_s
        self._drain_delay_s = drain_delay_s
        self._lifecycle = lifecycle
        self._loop: asyncio.AbstractEventLoop | None = None
        self._signalled = False
        self._draining: asyncio.Task[None] | None = None

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        try:
            await super().serve(sockets)
        finally:
            if self._draining is not None:
                self._draining.cancel()
                await asyncio.gather(self._draining, return_exceptions=True)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """From the signal handler: start the drain (first signal), else uvicorn's own way."""
        if self._signalled or self._loop is None or self.should_exit:
            super().handle_exit(sig, frame)
            return
        self._signalled = True
        self._captured_signals.append(sig)
        self._loop.call_soon_threadsafe(self._begin_drain)

    def _begin_drain(self) -> None:
        self._draining = asyncio.create_task(self.drain(), name="gpugate.drain")

    async def drain(self) -> None:
        """Not ready, still serving; then stop accepting; at the end of the grace, the cut."""
        self._lifecycle.drain()
        if self._drain_delay_s > 0:
            log.info(
                "draining: /readyz answers 503; serving %g s more before stopping",
                self._drain_delay_s,
            )
            await asyncio.sleep(self._drain_delay_s)
        self._lifecycle.stop(self._grace_s)
        self.should_exit = True
        await asyncio.sleep(self._grace_s)
        self._lifecycle.cut()


def make_server(
    app: ASGIApp,
    grace_s: float,
    *,
    tls: ssl.SSLContext | None = None,
    limits: ConnectionLimits | None = None,
) -> uvicorn.Server:
    """A uvicorn server for ``app`` with gpugate's settings (serve it with pre-bound sockets),
    speaking TLS with ``tls``, each connection held to ``limits`` (default: the defaults)."""
    config = _uvicorn_config(app, grace_s, limits or ConnectionLimits())
    return uvicorn.Server(_with_tls(config, tls))


def connection_limits(server: ServerConfig) -> ConnectionLimits:
    """The ``server.*`` connection limits as the HTTP protocol applies them."""
    return ConnectionLimits(
        header_timeout_s=server.header_timeout_s,
        max_header_bytes=server.max_header_bytes,
        max_headers=server.max_headers,
        body_timeout_s=server.body_timeout_s,
        max_connections=server.max_connections,
    )


def _with_tls(config: uvicorn.Config, tls: ssl.SSLContext | None) -> uvicorn.Config:
    if tls is not None:
        config.load()
        config.ssl = tls  # ours, not uvicorn's default cipher string
    return config


def _uvicorn_config(app: ASGIApp, grace_s: float, limits: ConnectionLimits) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        loop="uvloop",
        # httptools, with header/body timeouts and caps; the OpenAI routes served by the
        # protocol itself unless GPUGATE_FASTPATH=0 (gpugate.web.fastpath)
        http=fast_protocol(app, limits),
        lifespan="on",
        access_log=False,
        log_config=None,  # our logging (gpugate.logs) is already configured
        timeout_graceful_shutdown=max(1, round(grace_s)),
        timeout_keep_alive=30,
        server_header=False,
        proxy_headers=False,  # no X-Forwarded-* rewriting: one less middleware per request
        date_header=False,
    )


async def serve(  # noqa: PLR0913 - the app and its socket, then keyword-only settings
    app: ASGIApp,
    sock: socket.socket,
    *,
    grace_s: float,
    drain_delay_s: float = 0.0,
    lifecycle: Lifecycle | None = None,
    on_started: Callable[[], Awaitable[None]] | None = None,
    admin_sock: socket.socket | None = None,
    tls: ssl.SSLContext | None = None,
    limits: ConnectionLimits | None = None,
) -> bool:
    """Serve until a signal (drained first); True when startup and shutdown were clean."""
    _absorb_reraised_sigterm()
    server = DrainingServer(
        app,
        grace_s=grace_s,
        drain_delay_s=drain_delay_s,
        lifecycle=lifecycle or Lifecycle(SystemClock()),
        tls=tls,
        limits=limits,
    )
    sockets = [sock] if admin_sock is None else [sock, admin_sock]
    collector = IdleCollector(busy)  # collections between requests, not in them
    collector.start()
    try:
        return await _serve_until_done(server, sockets, on_started)
    finally:
        collector.stop()


async def _serve_until_done(
    server: DrainingServer,
    sockets: list[socket.socket],
    on_started: Callable[[], Awaitable[None]] | None,
) -> bool:
    task = asyncio.create_task(server.serve(sockets=sockets))
    if on_started is not None:
        while not server.started and not task.done():  # noqa: ASYNC110 - uvicorn has no event
            await asyncio.sleep(0.01)
        if server.started:
            await on_started()
    await task
    return server.started


def gateway_app(app: ASGIApp, admin_sock: socket.socket | None) -> ASGIApp:
    """``app`` as served: with an admin socket, the admin plane only there."""
    if admin_sock is None:
        return app
    return ListenerSplit(app, admin_sock.getsockname()[1])


async def serve_gateway(
    config: GatewayConfig,
    sock: socket.socket,
    *,
    environ: Mapping[str, str] | None = None,
    on_started: Callable[[], Awaitable[None]] | None = None,
    admin_sock: socket.socket | None = None,
    peers: Peers | None = None,
) -> bool:
    """Build the gateway, serve it until a signal, then stop it: the whole life of ``serve``;
    ``peers``: one worker of ``serve --workers`` (its /metrics merges its siblings')."""
    tls = server_tls(config.tls, config.source_map)  # before anything: one clear error
    raise_fd_limit()
    async with (
        build_gateway(
            config,
            environ=environ,
            present_error=present,
            processes=1 if peers is None else len(peers.paths),  # admission shared out
            takes_over=peers is None or peers.takes_over,
        ) as gateway,
        sibling_metrics(gateway.metrics, peers),
    ):
        app = gateway_app(create_app(gateway), admin_sock)
        # Everything built so far lives as long as the process: move it out of the collector's
        # sight, so a full collection under load scans only what requests allocate.
        gc.collect()
        gc.freeze()
        return await serve(
            app,
            sock,
            grace_s=config.server.shutdown_grace_s,
            drain_delay_s=config.server.drain_delay_s,
            lifecycle=gateway.lifecycle,
            on_started=on_started,
            admin_sock=admin_sock,
            tls=tls,
            limits=connection_limits(config.server),
        )
