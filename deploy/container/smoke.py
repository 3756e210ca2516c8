"""Smoke test of the built image: start it, talk to it, stop it (docs/production.md).

    python deploy/container/smoke.py [--image localhost/gpugate:0.1.0]

Runs the image read-only, as its non-root user, on the host's network (loopback only) in front
of a simulated model server started here, with a config of its own mounted read-only; checks
/healthz, /readyz, a chat completion through the real ``openai`` client, the user it runs as,
the image's HEALTHCHECK, and that SIGTERM ends it with exit code 0. Prints one line per check
and exits 1 if any fails. With no container engine, or no image built, it prints one notice line
and exits 0 (skipped). ENGINE (podman) and ENGINE_FLAGS (e.g. "--runtime runc") as build.sh.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ENGINE = os.environ.get("ENGINE", "podman")
FLAGS = shlex.split(os.environ.get("ENGINE_FLAGS", ""))
SKIPPED = 0


def engine(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run([ENGINE, *args], capture_output=True, text=True, check=check, timeout=120)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return int(resp.status)
    except OSError:
        return 0


def why_not(image: str) -> str | None:
    """Why the smoke test cannot run here, or None."""
    if shutil.which(ENGINE) is None:
        return f"no container engine ({ENGINE} not found)"
    if engine("image", "exists", image, check=False).returncode != 0:
        return f"no image {image} built here (deploy/container/build.sh builds it)"
    return None


async def smoke(image: str) -> list[tuple[str, bool, str]]:
    from openai import AsyncOpenAI

    from gpugate.fleet import ModelServer

    results: list[tuple[str, bool, str]] = []
    async with ModelServer(["smoke-model"], name="smoke") as upstream:
        port = free_port()
        etc = Path(tempfile.mkdtemp(prefix="gpugate-smoke-"))
        (etc / "gateway.yaml").write_text(
            f"listen: 127.0.0.1:{port}\n"
            "store: sqlite:////var/lib/gpugate/gpugate.db\n"
            f"upstreams:\n  - {{id: smoke, url: {upstream.url}, models: [smoke-model]}}\n"
            "blobs: {dir: /var/lib/gpugate/blobs}\n"
            "server: {drain_delay_s: 1, shutdown_grace_s: 5}\n"
        )
        etc.chmod(0o755)
        (etc / "gateway.yaml").chmod(0o644)
        volume = f"gpugate-smoke-{port}"
        run = engine(
            "run", "-d", *FLAGS, "--network=host", "--read-only", "--tmpfs=/tmp",
            f"--volume={etc}:/etc/gpugate:ro", f"--volume={volume}:/var/lib/gpugate",
            f"--env=GPUGATE_HEALTH_URL=http://127.0.0.1:{port}/healthz", image,
        )  # fmt: skip
        container = run.stdout.strip()
        try:
            url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 30
            while get(url + "/readyz") != 200 and time.monotonic() < deadline:
                await asyncio.sleep(0.2)
            results.append(("readyz 200", get(url + "/readyz") == 200, url))
            results.append(("healthz 200", get(url + "/healthz") == 200, ""))
            client = AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
            reply = await client.chat.completions.create(
                model="smoke-model", messages=[{"role": "user", "content": "hi"}]
            )
            await client.close()
            results.append(("chat completion", bool(reply.choices), reply.model))
            uid = engine("exec", container, "python3", "-c", "import os; print(os.getuid())")
            results.append(("runs as uid 10001", uid.stdout.strip() == "10001", uid.stdout.strip()))
            health = engine("healthcheck", "run", container, check=False)
            results.append(("HEALTHCHECK passes", health.returncode == 0, health.stdout.strip()))
            started = time.monotonic()
            engine("stop", "--time=20", container)
            code = engine("inspect", "--format", "{{.State.ExitCode}}", container).stdout.strip()
            took = f"{time.monotonic() - started:.1f} s"
            results.append(("SIGTERM: exit 0 after the drain", code == "0", f"code {code}, {took}"))
        finally:
            logs = engine("logs", container, check=False)
            if not all(ok for _, ok, _ in results):
                print(logs.stdout[-3000:], logs.stderr[-3000:], file=sys.stderr)
            engine("rm", "-f", container, check=False)
            engine("volume", "rm", "-f", volume, check=False)
            shutil.rmtree(etc, ignore_errors=True)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image", default="localhost/gpugate:0.1.0")
    args = parser.parse_args()
    reason = why_not(args.image)
    if reason is not None:
        print(f"container smoke test skipped: {reason}")
        return SKIPPED
    results = asyncio.run(smoke(args.image))
    for name, ok, detail in results:
        print(f"{'ok  ' if ok else 'FAIL'} {name:<34} {detail}")
    return 0 if results and all(ok for _, ok, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())
