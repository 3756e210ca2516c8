"""The real `gpugate` command as a subprocess: serve, graceful shutdown, port in use, demo."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import pytest

from gpugate.fleet import ModelServer, ServerBehaviour
from harness import eventually
from ports import free_port, free_ports

pytestmark = pytest.mark.e2e

GPUGATE = [sys.executable, "-m", "gpugate"]
ADMIN = {"Authorization": "Bearer demo-admin-token"}


@asynccontextmanager
async def gpugate(
    *args: str, env: dict[str, str] | None = None
) -> AsyncIterator[asyncio.subprocess.Process]:
    proc = await asyncio.create_subprocess_exec(
        *GPUGATE,
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, **(env or {})},
    )
    try:
        yield proc
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def wait_ready(
    http: aiohttp.ClientSession, url: str, proc: asyncio.subprocess.Process
) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if proc.returncode is not None:
            out, err = await proc.communicate()
            pytest.fail(f"gpugate exited {proc.returncode}: {out.decode()} {err.decode()}")
        try:
            async with http.get(url + "/readyz") as resp:
                if resp.status == 200:
                    return
        except aiohttp.ClientConnectionError:
            pass
        await asyncio.sleep(0.05)
    pytest.fail("gpugate did not become ready within 20 s")


def write_config(path: Path, *, port: int, upstream_url: str, grace_s: float = 10) -> Path:
    path.write_text(
        f"""\
listen: 127.0.0.1:{port}
store: sqlite:///{path.parent / "gw.db"}
upstreams:
  - id: slow
    url: {upstream_url}
    models: [slow-model]
server:
  shutdown_grace_s: {grace_s}
"""
    )
    return path


async def test_sigterm_lets_a_slow_request_finish_and_exits_0_within_the_grace_period(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    behaviour = ServerBehaviour(delay_s=1.5)
    async with ModelServer(["slow-model"], name="slow", behaviour=behaviour) as slow:
        port = free_port()
        config = write_config(tmp_path / "gw.yaml", port=port, upstream_url=slow.url, grace_s=10)
        async with gpugate("serve", "--config", str(config)) as proc:
            url = f"http://127.0.0.1:{port}"
            await wait_ready(http, url, proc)
            body = {"model": "slow-model", "messages": [{"role": "user", "content": "hi"}]}
            request = asyncio.ensure_future(http.post(url + "/v1/chat/completions", json=body))
            await eventually(lambda: slow.stats.open_requests == 1, what="request in flight")
            sent_term_at = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            response = await request
            assert 200 == response.status
            assert (await response.json())["choices"]
            code = await asyncio.wait_for(proc.wait(), timeout=10)
            assert 0 == code
            assert time.monotonic() - sent_term_at < 10


async def test_a_port_already_in_use_is_one_clear_error_and_a_nonzero_exit(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = write_config(tmp_path / "gw.yaml", port=port, upstream_url="http://127.0.0.1:9")
        async with gpugate("serve", "--config", str(config)) as proc:
            _, err = await asyncio.wait_for(proc.communicate(), timeout=20)
    assert 1 == proc.returncode
    assert f"cannot listen on 127.0.0.1:{port}: address already in use" in err.decode()
    assert "Traceback" not in err.decode()


async def test_serve_refuses_to_start_when_the_store_is_unreachable(tmp_path: Path) -> None:
    config = tmp_path / "gw.yaml"
    config.write_text(
        f"listen: 127.0.0.1:{free_port()}\nstore: postgresql://nobody@127.0.0.1:1/none\n"
        "upstreams: [{id: a, url: 'http://127.0.0.1:9', models: [m]}]\n"
    )
    async with gpugate("serve", "--config", str(config)) as proc:
        _, err = await asyncio.wait_for(proc.communicate(), timeout=30)
    assert 1 == proc.returncode
    assert "127.0.0.1:1" in err.decode()
    assert "Traceback" not in err.decode()


async def test_demo_brings_up_the_gateway_and_the_fleet_and_stops_on_sigterm(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    port = free_port()
    workdir = tmp_path / "state"
    demo = ["demo", "--listen", f"127.0.0.1:{port}", "--workdir", str(workdir)]
    async with gpugate(*demo, env={"GPUGATE_ADMIN_TOKEN": "demo-admin-token"}) as proc:
        url = f"http://127.0.0.1:{port}"
        await wait_ready(http, url, proc)
        async with http.get(url + "/v1/models") as resp:
            models = sorted(m["id"] for m in (await resp.json())["data"])
        assert ["bge-m3", "cleanup-3b", "doc-classifier", "qwen-35b", "qwen-7b"] == models
        body = {"model": "qwen-35b", "messages": [{"role": "user", "content": "hi"}]}
        async with http.post(url + "/v1/chat/completions", json=body) as resp:
            assert 200 == resp.status
            assert "qwen-35b" == resp.headers["X-Gateway-Upstream"]
        job = {"model": "qwen-35b", "input": {"messages": body["messages"]}}
        async with http.post(url + "/v1/jobs", json=job) as resp:
            slug = (await resp.json())["slug"]
        async with asyncio.timeout(10):
            state = "queued"
            while state != "completed":
                async with http.get(f"{url}/v1/jobs/{slug}") as resp:
                    state = (await resp.json())["state"]
                await asyncio.sleep(0.02)
        async with http.get(f"{url}/admin/gpus", headers=ADMIN) as resp:
            gpus = (await resp.json())["gpus"]
        assert [0, 1] == [gpu["gpu"] for gpu in gpus]
        proc.send_signal(signal.SIGTERM)
        out, _ = await asyncio.wait_for(proc.communicate(), timeout=15)
    assert 0 == proc.returncode
    assert f"gpugate demo is up: {url}" in out.decode()
    assert (workdir / "demo.yaml").exists()


async def test_gpugate_fleet_ports_fixes_every_members_port_so_a_second_run_matches_the_config(
    http: aiohttp.ClientSession,
) -> None:
    ports = free_ports(6)  # the demo fleet: five model servers, then the exporter
    async with gpugate("fleet", "--ports", ",".join(map(str, ports))) as proc:
        assert proc.stdout is not None
        lines = [(await proc.stdout.readline()).decode() for _ in range(6)]
        for port, line in zip(ports, lines, strict=True):
            assert f"http://127.0.0.1:{port}" in line, line
        async with http.get(f"http://127.0.0.1:{ports[0]}/v1/models") as resp:
            assert 200 == resp.status
            assert "qwen-35b" in await resp.text()
        async with http.get(f"http://127.0.0.1:{ports[-1]}/metrics") as resp:
            assert "DCGM_FI_DEV_GPU_UTIL" in await resp.text()
        proc.send_signal(signal.SIGTERM)
        assert 0 == await asyncio.wait_for(proc.wait(), timeout=10)


async def test_gpugate_fleet_refuses_a_ports_list_of_the_wrong_length() -> None:
    async with gpugate("fleet", "--ports", "9001,9002") as proc:
        _, err = await asyncio.wait_for(proc.communicate(), timeout=20)
    assert 2 == proc.returncode
    assert "--ports needs 6 ports (qwen-35b, qwen-7b, cleanup-3b" in err.decode()


async def test_gpugate_fleet_with_a_port_taken_is_one_clear_error_and_a_nonzero_exit() -> None:
    ports = free_ports(6)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", ports[2]))
        taken.listen()
        async with gpugate("fleet", "--ports", ",".join(map(str, ports))) as proc:
            out, err = await asyncio.wait_for(proc.communicate(), timeout=20)
    assert 1 == proc.returncode
    expected = f"gpugate: error: cannot listen on 127.0.0.1:{ports[2]}: address already in use\n"
    assert (b"", expected) == (out, err.decode())


def write_tls_config(path: Path, *, port: int, cert_file: Path, key_file: Path) -> Path:
    path.write_text(
        f"""\
listen: 127.0.0.1:{port}
store: sqlite:///{path.parent / "gw.db"}
upstreams:
  - {{id: a, url: 'http://127.0.0.1:9', models: [m]}}
tls:
  cert_file: {cert_file}
  key_file: {key_file}
"""
    )
    return path


async def test_serve_with_tls_files_it_cannot_read_names_each_key_and_line_before_listening(
    tmp_path: Path,
) -> None:
    cert, key = tmp_path / "absent.crt", tmp_path / "absent.key"
    config = write_tls_config(tmp_path / "gw.yaml", port=free_port(), cert_file=cert, key_file=key)

    async with gpugate("serve", "--config", str(config)) as proc:
        out, err = await asyncio.wait_for(proc.communicate(), timeout=20)

    assert (1, b"") == (proc.returncode, out)
    assert [
        f"tls.cert_file: cannot read {cert}: No such file or directory (line 6)",
        f"tls.key_file: cannot read {key}: No such file or directory (line 7)",
        f"{config}: 2 problems",
    ] == err.decode().splitlines()
    assert not (tmp_path / "gw.db").exists()  # nothing started


async def test_serve_with_a_certificate_that_does_not_load_names_its_line_before_listening(
    tmp_path: Path,
) -> None:
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    config = write_tls_config(
        tmp_path / "gw.yaml", port=free_port(), cert_file=garbage, key_file=garbage
    )

    async with gpugate("serve", "--config", str(config)) as proc:
        out, err = await asyncio.wait_for(proc.communicate(), timeout=20)

    assert (1, b"") == (proc.returncode, out)
    problem, summary = err.decode().splitlines()
    assert problem.startswith("tls.cert_file: cannot load the certificate and key: ")
    assert problem.endswith(" (line 6)")
    assert f"{config}: 1 problem" == summary
