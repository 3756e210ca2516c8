"""What the console's ring of samples costs the gateway, against one Prometheus scrape.

Fills a real :class:`~gpugate.metrics.Metrics` the way a busy gateway would (upstreams x classes
x codes of requests, per-model latency and per-upstream TTFB histograms, queues, GPUs, runtimes),
then times, in the same run: ``Metrics.render()`` (one ``GET /metrics``, the baseline a scraper
already costs every 15 s), one ``Sampler.tick()`` (what the console adds every
``server.console_sample_s``), the ring's size once full (an hour at 5 s), and drawing the fleet
page's charts from it (each live refresh of an open console tab). Prints the figures and the
ratios.

    python bench/console_samples.py            # ~10 s
    python bench/console_samples.py --quick    # smoke test
"""

from __future__ import annotations

import argparse
import sys
import time
import tracemalloc
from collections.abc import Callable

from gpugate.clock import ManualClock
from gpugate.metrics import Metrics
from gpugate.services.samples import Sampler
from gpugate.web.console.charts import line_chart

CODES = ("200", "400", "429", "503", "NO_HEALTHY_UPSTREAM", "QUEUE_TIMEOUT", "UPSTREAM_TIMEOUT")
CLASSES = ("interactive", "batch", "system")


def busy_metrics(upstreams: int, gpus: int, runtimes: int) -> Metrics:
    metrics = Metrics()
    for u in range(upstreams):
        model, upstream = f"model-{u}", f"upstream-{u}"
        for cls in CLASSES:
            for code in CODES:
                metrics.requests.labels(model, upstream, cls, code).inc(1000)
            timer = metrics.request_duration.labels(model, cls)
            for i in range(200):
                timer.observe(0.001 * (i % 50 + 1))
            metrics.queue_depth.labels(upstream, cls).set(u)
        for i in range(200):
            metrics.upstream_ttfb.labels(upstream).observe(0.002 * (i % 40 + 1))
    for g in range(gpus):
        labels = (f"node-{g // 8}", str(g % 8), "")
        metrics.gpu_util.labels(*labels).set(50)
        metrics.gpu_temp.labels(*labels).set(60)
        metrics.gpu_faulted.labels(*labels).set(0)
    for r in range(runtimes):
        metrics.runtime_queue_depth.labels(f"rt-{r}").set(r)
        metrics.runtime_in_flight.labels(f"rt-{r}").set(r)
        metrics.runtime_spend_today.labels(f"rt-{r}").set(r * 10)
    return metrics


def per_call_us(call: Callable[[], object], seconds: float) -> float:
    """Microseconds per call, over at least ``seconds`` (and at least 20 calls)."""
    n, start = 0, time.perf_counter()
    while n < 20 or time.perf_counter() - start < seconds:
        call()
        n += 1
    return (time.perf_counter() - start) / n * 1e6


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="0.2 s per figure")
    parser.add_argument("--upstreams", type=int, default=8)
    parser.add_argument("--gpus", type=int, default=16)
    parser.add_argument("--runtimes", type=int, default=4)
    args = parser.parse_args(argv)
    seconds = 0.2 if args.quick else 3.0
    metrics = busy_metrics(args.upstreams, args.gpus, args.runtimes)
    clock = ManualClock()
    ring = Sampler(metrics.read, clock, every_s=5.0, keep=720)

    def tick() -> None:
        metrics.requests.labels("model-0", "upstream-0", "interactive", "200").inc()
        clock.advance(5.0)
        ring.tick()

    series = sum(1 for _ in metrics.read())
    render_us = per_call_us(metrics.render, seconds)
    read_us = per_call_us(metrics.read, seconds)
    tick_us = per_call_us(tick, seconds)

    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    full = Sampler(metrics.read, clock, every_s=5.0, keep=720)
    for _ in range(720 + 10):
        clock.advance(5.0)
        full.tick()
    ring_bytes = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()

    def draw() -> None:  # what one live refresh of the fleet page computes from a full ring
        for name in ("requests", "latency", "ttfb", "queue", "gpu_util", "gpu_temp"):
            line_chart(name, name, "", full.window(name), span=full.span, gap_s=12.5)

    draw_us = per_call_us(draw, seconds)

    print(
        f"fleet: {args.upstreams} upstreams x {len(CLASSES)} classes x {len(CODES)} codes, "
        f"{args.gpus} GPUs, {args.runtimes} runtimes; {series} sample names in the registry\n"
        f"  Metrics.render() (one /metrics scrape, baseline) {render_us:9.0f} us\n"
        f"  Metrics.read()   (what the sampler reads)        {read_us:9.0f} us"
        f"  = {read_us / render_us:.2f} x the scrape\n"
        f"  Sampler.tick()   (read + every series)           {tick_us:9.0f} us"
        f"  = {tick_us / render_us:.2f} x the scrape, every 5 s:"
        f" {tick_us / 5e6 * 100:.3f} % of one core\n"
        f"  a full ring (720 samples, 1 h at 5 s)            {ring_bytes / 1e6:9.2f} MB"
        f" ({len(full)} kept after {720 + 10} ticks)\n"
        f"  the fleet page's 6 charts from the full ring     {draw_us:9.0f} us"
        f"  = {draw_us / render_us:.2f} x the scrape, per open console tab every 3 s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
