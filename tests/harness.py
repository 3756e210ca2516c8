"""Test harness: a real gateway on a free loopback port in front of real fake servers.

Imported by tests as ``from harness import ...`` (``tests/`` is on pytest's pythonpath).
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import pytest

from gpugate.clock import Clock
from gpugate.config import GatewayConfig, config_from_document
from gpugate.fleet import ModelServer, ServerBehaviour
from gpugate.listen import bind
from gpugate.server import connection_limits, make_server
from gpugate.web.app import create_app
from gpugate.web.batches import present
from gpugate.wiring import Gateway, build_gateway
from workers.processes import NotInProcess, requested_workers, serve_process


@dataclass
class RunningGateway:
    """A gateway serving on a real socket, with its internals at hand for assertions."""

    url: str
    gateway: Gateway

    @property
    def v1(self) -> str:
        return self.url + "/v1"


def upstream(uid: str, urls: list[str], models: list[str], **extra: Any) -> dict[str, Any]:
    """An upstream entry of a config document."""
    entry: dict[str, Any] = {"id": uid, "models": models, **extra}
    if len(urls) == 1:
        entry["url"] = urls[0]
    else:
        entry["urls"] = urls
    return entry


def make_config(store: str, upstreams: list[dict[str, Any]], **extra: Any) -> GatewayConfig:
    """A validated config from plain data (the same validation as a YAML file); blobs in a
    fresh temporary directory unless given (never in the working directory)."""
    extra.setdefault("blobs", {"dir": tempfile.mkdtemp(prefix="gpugate-blobs-")})
    return config_from_document({"store": store, "upstreams": upstreams, **extra})


@contextlib.asynccontextmanager
async def serving(
    config: GatewayConfig,
    *,
    environ: Mapping[str, str] | None = None,
    probe_interval_s: float = 3600.0,
    clock: Clock | None = None,
    run_job_loops: bool = True,
    port: int = 0,
) -> AsyncIterator[RunningGateway]:
    """Build the gateway and serve it with uvicorn on 127.0.0.1:<port> (default: a free one)
    until the block ends; ``run_job_loops=False`` leaves the dispatcher and reaper to the test.

    With ``GPUGATE_TEST_WORKERS=N`` (N > 1) a real ``gpugate serve --workers N`` instead, for
    the tests that use neither ``clock`` nor the gateway's internals (tests/workers/processes.py:
    a test that reads them is skipped in that mode).
    """
    workers = requested_workers()
    if workers > 1 and clock is None and run_job_loops:
        async with serve_process(config, workers=workers, environ=environ, port=port) as served:
            yield RunningGateway(served[0], NotInProcess())  # type: ignore[arg-type]
        return
    sock = bind("127.0.0.1", port)
    port = sock.getsockname()[1]
    async with build_gateway(
        config,
        environ=environ or {},
        probe_interval_s=probe_interval_s,
        clock=clock,
        run_job_loops=run_job_loops,
        present_error=present,
    ) as gateway:
        limits = connection_limits(config.server)
        server = make_server(create_app(gateway), grace_s=1, limits=limits)
        task = asyncio.create_task(server.serve(sockets=[sock]))
        async with asyncio.timeout(10):
            while not server.started:
                assert not task.done(), "uvicorn did not start"
                await asyncio.sleep(0.01)
        try:
            yield RunningGateway(f"http://127.0.0.1:{port}", gateway)
        finally:
            server.should_exit = True
            await task


@contextlib.asynccontextmanager
async def model_servers(
    *specs: tuple[str, list[str]], behaviour: ServerBehaviour | None = None
) -> AsyncIterator[list[ModelServer]]:
    """Start fake model servers ``(name, models)`` on free ports."""
    servers = [ModelServer(models, name=name, behaviour=behaviour) for name, models in specs]
    async with contextlib.AsyncExitStack() as stack:
        for server in servers:
            await stack.enter_async_context(server)
        yield servers


@contextlib.asynccontextmanager
async def connection(
    gw: RunningGateway,
) -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    """A raw TCP connection to the gateway, for tests that speak HTTP/1.1 by hand."""
    host, port = gw.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        yield reader, writer
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


async def eventually(
    condition: Callable[[], bool], *, within_s: float = 5.0, what: str = "condition"
) -> None:
    """Wait (bounded) until ``condition()`` holds; fail naming ``what`` if it never does."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    while not condition():
        if loop.time() > deadline:
            pytest.fail(f"{what} did not hold within {within_s} s")
        await asyncio.sleep(0.005)
