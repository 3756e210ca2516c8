"""``gpugate serve`` with Python's cyclic collector tuned once the gateway has started: the
bench's ``gpugate-gc`` target (``bench/proxy.py --targets ...,gpugate-gc``), an experiment for
the server's start-up, measured beside the untuned ``gpugate`` in the same run.

After ``TUNE_AFTER_S`` (the bench waits for ``/readyz`` before it measures), everything alive is
frozen out of every collection (``gc.freeze()``: the config, the app, the imported modules) and
the youngest generation is collected every 50,000 container allocations instead of 700. gpugate's
request path leaves no reference cycles behind (``hotpath_micro.py --gateway`` with the
collector off, then ``gc.collect()``: 0 unreachable objects), so collecting less often lets
nothing pile up; what it saves is the collections themselves, which stop the event loop — a
full one over an untuned gateway's heap for tens of milliseconds, inside some request's
latency.

    python bench/proxy_gc_serve.py serve --config gateway.yaml
"""

from __future__ import annotations

import gc
import threading

from gpugate.cli import main

TUNE_AFTER_S = 3.0
YOUNGEST = 50_000  # allocations between collections of the youngest generation (default 700)


def tune() -> None:
    gc.freeze()
    gc.set_threshold(YOUNGEST, 20, 20)


if __name__ == "__main__":
    timer = threading.Timer(TUNE_AFTER_S, tune)
    timer.daemon = True
    timer.start()
    raise SystemExit(main())
