"""``gpugate serve`` with every collection of Python's cyclic collector timed: the bench's
``--gc-watch`` wrapper (``bench/proxy_bursts.py``), to see whether the collector's pauses are what
a burst's tail waits for. Every 0.5 s the counts, total and longest pause per generation are
written as JSON to the file named by ``GPUGATE_GC_WATCH``. ``GPUGATE_GC_TUNE=1``: tuned as
``proxy_gc_serve.py`` tunes it (the ``gpugate-gc`` target, watched). ``GPUGATE_GC_CYCLES=1``:
what the collector found unreachable is kept (``gc.DEBUG_SAVEALL``) and counted by type, to
find the reference cycles requests leave (a diagnosis: the garbage is never freed).

    GPUGATE_GC_WATCH=/tmp/gc.json python bench/proxy_gc_watch.py serve --config gateway.yaml
"""

from __future__ import annotations

import gc
import json
import os
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from gpugate.cli import main

PAUSES: dict[int, list[float]] = {0: [], 1: [], 2: []}  # ms, per generation
_began = [0.0]


def _timed(phase: str, info: dict[str, Any]) -> None:
    if phase == "start":
        _began[0] = time.perf_counter()
    else:
        PAUSES[info["generation"]].append((time.perf_counter() - _began[0]) * 1000)


def summary() -> dict[str, Any]:
    """Per generation: collections, their total and longest pause (ms), and those over 1 ms."""
    return {
        str(gen): {
            "n": len(ms),
            "total_ms": round(sum(ms), 2),
            "max_ms": round(max(ms, default=0.0), 2),
            "over_1ms": sum(x > 1 for x in ms),
        }
        for gen, ms in PAUSES.items()
    } | {
        "frozen": gc.get_freeze_count(),
        "threshold": gc.get_threshold(),
        "garbage": len(gc.garbage),
        "garbage_types": Counter(type(o).__qualname__ for o in gc.garbage).most_common(12),
    }


def _write(path: Path) -> None:
    fresh = path.with_suffix(".tmp")
    while True:
        time.sleep(0.5)
        fresh.write_text(json.dumps(summary()))
        fresh.replace(path)


if __name__ == "__main__":
    gc.callbacks.append(_timed)
    threading.Thread(
        target=_write, args=(Path(os.environ["GPUGATE_GC_WATCH"]),), daemon=True
    ).start()
    if os.environ.get("GPUGATE_GC_CYCLES") == "1":
        threading.Timer(3.0, gc.set_debug, args=(gc.DEBUG_SAVEALL,)).start()
    if os.environ.get("GPUGATE_GC_TUNE") == "1":
        from proxy_gc_serve import TUNE_AFTER_S, tune

        threading.Timer(TUNE_AFTER_S, tune).start()
    raise SystemExit(main())
