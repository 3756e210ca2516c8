"""What the connection limits (``web/connections.py``) cost a request: uvicorn's own httptools
protocol against gpugate's guarded subclass, serving the same tiny ASGI app, in one run.

    python bench/connections.py            # 3 rounds of 5 s each, alternating
    python bench/connections.py --quick    # 1 round of 2 s

Each server is its own process on a free loopback port (uvloop, httptools, one worker); ``wrk
-t1 -c64`` sends small POSTs (a 200-byte JSON body, each request in one packet: the common case,
which arms no timer) and then GETs. The rounds alternate so a busy machine slows both alike; the
figure is the best round of each, and the ratio guarded / plain.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from proxy_targets import Processes, free_port, wait_http

SERVER = """
import sys, uvicorn
from gpugate.web.connections import ConnectionLimits, guarded_protocol

async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    more = True
    while more:
        message = await receive()
        more = message.get("more_body", False)
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"{}"})

http = guarded_protocol(ConnectionLimits()) if sys.argv[2] == "guarded" else "httptools"
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), loop="uvloop", http=http,
            lifespan="off", access_log=False, log_level="warning")
"""
LUA = """
wrk.method = "POST"
wrk.body = '{"model": "m", "messages": [{"role": "user", "content": "%s"}]}'
wrk.headers["Content-Type"] = "application/json"
"""


def wrk(url: str, seconds: float, script: Path | None) -> float:
    argv = ["wrk", "-t1", "-c64", f"-d{seconds:g}s", url]
    if script is not None:
        argv[1:1] = ["-s", str(script)]
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    match = re.search(r"Requests/sec:\s+([\d.]+)", out)
    if match is None or "Non-2xx" in out or "Socket errors" in out:
        raise SystemExit(f"wrk failed against {url}:\n{out}")
    return float(match.group(1))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    rounds, seconds = (1, 2.0) if args.quick else (3, 5.0)
    with tempfile.TemporaryDirectory(prefix="gpugate-conn-") as tmp, Processes(Path(tmp)) as procs:
        work = Path(tmp)
        (work / "server.py").write_text(SERVER)
        script = work / "post.lua"
        script.write_text(LUA % ("x" * 120))
        urls = {}
        for kind in ("plain", "guarded"):
            port = free_port()
            procs.start(kind, [sys.executable, str(work / "server.py"), str(port), kind])
            urls[kind] = f"http://127.0.0.1:{port}/"
        for url in urls.values():
            wait_http(procs, url)
        best: dict[tuple[str, str], float] = {}
        started = time.monotonic()
        for _ in range(rounds):
            for load, lua in (("POST", script), ("GET", None)):
                for kind, url in urls.items():
                    rate = wrk(url, seconds, lua)
                    best[kind, load] = max(best.get((kind, load), 0.0), rate)
        procs.check()
    print(
        f"connections bench: {rounds} round(s) of {seconds:g} s, {time.monotonic() - started:.0f} s"
    )
    print(f"{'':8}{'plain req/s':>14}{'guarded req/s':>16}{'guarded/plain':>16}")
    for load in ("POST", "GET"):
        plain, guarded = best["plain", load], best["guarded", load]
        print(f"{load:8}{plain:>14.0f}{guarded:>16.0f}{guarded / plain:>16.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
