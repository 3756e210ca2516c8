"""The push worker's HTTP face (``/calls``, DESIGN §3 push protocol) and its process.

Every ``/calls`` request must carry the gateway's signature (or with ``--auth bearer`` the
runtime's secret as a bearer token), else 401; a replayed one is 401 too. Every answer to a
signed request is signed for it (:func:`_signed`), so the gateway can believe it.

* ``POST /calls`` — a push: ``202 {"call_id"}``; 401 without the runtime's secret, 400 for a
  body it cannot run, 429 (``Retry-After``) when every ``--concurrency`` slot is taken;
* ``GET /calls/{call_id}`` — ``{"state": queued|running|completed|failed, ...}`` with the
  result or the error once finished; 404 ``{"state": "unknown"}`` for a call it does not hold;
* ``DELETE /calls/{call_id}`` — cancel: 204, or 404 for an unknown call;
* ``GET /healthz`` — liveness, without the secret.

:func:`serve_worker` runs the whole process until SIGTERM/SIGINT or ``--idle-exit-s``, over TLS
with ``--tls-cert-file``/``--tls-key-file`` (and ``--tls-client-ca-file``: the gateway must
present a certificate that CA signed).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from gpugate.listen import bind
from gpugate.push_signature import HEADER, BadSignature
from gpugate.worker.calls import Push
from gpugate.worker.links import Links
from gpugate.worker.outbox import Outbox
from gpugate.worker.worker import Worker, WorkerBusy, WorkerSettings

log = logging.getLogger("gpugate.worker")

_MAX_BODY = 64 * 1024 * 1024
_WORKER: web.AppKey[Worker] = web.AppKey("worker", Worker)


def _error(status: int, code: str, message: str, **headers: str) -> web.Response:
    body = {"error": {"message": message, "type": "worker_error", "code": code}}
    return web.json_response(body, status=status, headers=headers or None)


_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def _signed(request: web.Request, handler: _Handler) -> web.StreamResponse:
    """Admit only the gateway's requests to ``/calls``; sign every answer to a signed one."""
    if not request.path.startswith("/calls"):
        return await handler(request)
    worker = request.app[_WORKER]
    body = await request.read()
    try:
        nonce = worker.admit(request.method, request.raw_path, body, request.headers)
    except BadSignature as exc:
        log.warning("refused %s %s: %s", request.method, request.path, exc)
        return _error(401, "UNAUTHORIZED", f"not the gateway's request: {exc}")
    response = await handler(request)
    if nonce is not None and isinstance(response, web.Response):
        raw = response.body if isinstance(response.body, bytes) else b""
        response.headers[HEADER] = worker.sign_answer(nonce, response.status, raw)
    return response


async def _push(request: web.Request) -> web.Response:
    worker = request.app[_WORKER]
    try:
        push = Push.parse(json.loads(await request.read()))
    except ValueError as exc:  # PushRejected, or the body is not JSON
        return _error(400, "BAD_REQUEST", str(exc))
    try:
        call_id = worker.accept(push)
    except WorkerBusy:
        slots = worker.settings.concurrency
        return _error(429, "WORKER_BUSY", f"all {slots} slot(s) run a call", **{"Retry-After": "1"})
    return web.json_response({"call_id": call_id}, status=202)


async def _status(request: web.Request) -> web.Response:
    worker = request.app[_WORKER]
    view = worker.status(request.match_info["call_id"])
    if view is None:
        return web.json_response({"state": "unknown"}, status=404)
    return web.json_response(view)


async def _cancel(request: web.Request) -> web.Response:
    worker = request.app[_WORKER]
    if not worker.cancel(request.match_info["call_id"]):
        return web.json_response({"state": "unknown"}, status=404)
    return web.Response(status=204)


async def _healthz(request: web.Request) -> web.Response:
    worker = request.app[_WORKER]
    return web.json_response(
        {"status": "ok", "runtime": worker.settings.runtime_id, "active": worker.active}
    )


def make_app(worker: Worker) -> web.Application:
    """The ``/calls`` routes over ``worker``."""
    app = web.Application(client_max_size=_MAX_BODY, middlewares=[_signed])
    app[_WORKER] = worker
    app.router.add_post("/calls", _push)
    app.router.add_get("/calls/{call_id}", _status)
    app.router.add_delete("/calls/{call_id}", _cancel)
    app.router.add_get("/healthz", _healthz)
    return app


def worker_tls(settings: WorkerSettings) -> tuple[ssl.SSLContext | None, ssl.SSLContext | None]:
    """The TLS context ``/calls`` is served with (None: plain HTTP) and the one reports to an
    ``https://`` gateway use (None: the system's CAs): it trusts ``--gateway-ca-file`` and
    presents the worker's own certificate to a gateway that requires one."""
    served = None
    if settings.tls_cert_file is not None:
        served = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        served.minimum_version = ssl.TLSVersion.TLSv1_2
        served.load_cert_chain(settings.tls_cert_file, settings.tls_key_file)
        if settings.tls_client_ca_file is not None:
            served.load_verify_locations(cafile=settings.tls_client_ca_file)
            served.verify_mode = ssl.CERT_REQUIRED
    outgoing = None
    if settings.gateway_ca_file is not None or settings.tls_cert_file is not None:
        outgoing = ssl.create_default_context(
            cafile=str(settings.gateway_ca_file) if settings.gateway_ca_file else None
        )
        outgoing.minimum_version = ssl.TLSVersion.TLSv1_2
        if settings.tls_cert_file is not None:
            outgoing.load_cert_chain(settings.tls_cert_file, settings.tls_key_file)
    return served, outgoing


@dataclass(frozen=True, slots=True)
class RunningWorker:
    """A started worker and the base URL it serves (``push.url`` is ``{url}/calls``)."""

    worker: Worker
    url: str


@contextlib.asynccontextmanager
async def running_worker(
    settings: WorkerSettings, host: str, port: int
) -> AsyncIterator[RunningWorker]:
    """The worker serving ``/calls`` on ``host:port`` (0: a free port) for the block; a taken
    port is a :class:`~gpugate.errors.ListenError`, before anything else starts."""
    with bind(host, port) as sock:
        served, gateway_tls = worker_tls(settings)
        links = Links(
            settings.gateway_url,
            settings.secret,
            settings.upstream_url,
            auth=settings.auth,
            gateway_tls=gateway_tls,
            runtime_id=settings.runtime_id,
        )
        await links.start()
        worker = Worker(settings, links, Outbox(settings.state_dir))
        runner = web.AppRunner(make_app(worker), access_log=None)
        try:
            await worker.start()
            await runner.setup()
            site = web.SockSite(runner, sock, ssl_context=served)
            await site.start()
            bound = runner.addresses[0][1]
            scheme = "https" if served is not None else "http"
            url = f"{scheme}://{f'[{host}]' if ':' in host else host}:{bound}"
            log.info(
                "gpugate worker %s listening on %s/calls, reporting to %s",
                settings.runtime_id,
                url,
                settings.gateway_url,
            )
            yield RunningWorker(worker, url)
        finally:
            await runner.cleanup()
            await worker.close()
            await links.close()


async def serve_worker(settings: WorkerSettings, host: str, port: int) -> int:
    """Run the worker until SIGTERM/SIGINT or ``idle_exit_s`` of idleness; the exit code."""
    loop = asyncio.get_running_loop()
    signals = (signal.SIGTERM, signal.SIGINT)
    try:
        async with running_worker(settings, host, port) as running:
            worker = running.worker
            stop = asyncio.Event()
            for signum in signals:
                loop.add_signal_handler(signum, stop.set)
            waiters: list[asyncio.Task[Any]] = [
                asyncio.create_task(stop.wait()),
                asyncio.create_task(worker.idle_exit()),
            ]
            done, _ = await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            if waiters[1] in done:
                log.info("idle for %s s: exiting", settings.idle_exit_s)
            for waiter in waiters:
                waiter.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.gather(*waiters, return_exceptions=True)
    finally:
        for signum in signals:
            loop.remove_signal_handler(signum)
    return 0
