"""Where the gateway's time goes: ``py-spy record`` on it during the end-to-end phase (optional).

``--profile DIR`` records the gateway at 200 Hz as raw folded stacks (``DIR/gateway-<backend>.txt``,
one line per distinct stack: ``frame;frame;...;frame count``) and prints the functions holding
the most samples, on their own (self) and, for gpugate's own functions, with what they call
(inclusive). py-spy counts a sample when it judges the thread busy; on a VM it may count some
waiting too (a thread blocked on the GIL or its queue): read the shares as relative weights.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

PY_SPY = ("py-spy", "/tmp/pyspy/bin/py-spy")
TOP = 15
MAIN, THREADED = "event loop", "worker threads (SQLite's store thread)"
_LINE = re.compile(r"\s*\(([^()]*):\d+\)$")  # "func (path/file.py:123)" -> "func (file.py)"


def find_py_spy() -> str | None:
    return next((found for name in PY_SPY if (found := shutil.which(name))), None)


@contextlib.contextmanager
def recording(binary: str | None, pid: int, out: Path | None) -> Iterator[None]:
    """py-spy on ``pid`` while the block runs (nothing when ``out`` is None)."""
    if binary is None or out is None:
        yield
        return
    argv = [binary, "record", "-p", str(pid), "-r", "200", "-f", "raw", "-o", str(out)]
    with (out.with_suffix(".log")).open("wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    try:
        yield
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGINT)  # py-spy writes its file on Ctrl-C
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


def _frame(frame: str) -> str:
    """``func (file.py)``, or ``func (gpugate/dir/file.py)`` for the gateway's own code."""

    def short(match: re.Match[str]) -> str:
        path = "/" + match.group(1)  # py-spy names a package's files from the package down
        _, ours, rest = path.rpartition("/gpugate/")
        return f" (gpugate/{rest})" if ours else f" ({Path(path).name})"

    return _LINE.sub(short, frame)


def summarise(raw: Path) -> str:
    """The top functions of a raw py-spy recording, self and inclusive, in % of samples."""
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    threads: Counter[str] = Counter()
    for line in raw.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = [_frame(f) for f in stack.split(";")]
        threads[THREADED if frames[0].startswith("Thread._bootstrap") else MAIN] += int(count)
        own[frames[-1]] += int(count)
        for frame in set(frames):
            if "(gpugate/" in frame and "(gpugate/cli.py)" not in frame and "__main__" not in frame:
                inclusive[frame] += int(count)
    total = threads.total()
    if not total:
        return f"{raw}: no samples"
    split = ", ".join(f"{name} {n / total:.0%}" for name, n in threads.most_common())
    lines = [f"{raw.name}: {total:,} samples ({split})"]
    for title, counts in (("self", own), ("inclusive, gpugate's own functions", inclusive)):
        lines.append(f"  top {TOP} by {title}:")
        lines += [f"    {n / total:6.1%}  {name}" for name, n in counts.most_common(TOP)]
    return "\n".join(lines)
