"""The proxy benchmark's report: what one run measured, its tables, ratios and targets, and the
Markdown summary for BENCHMARKS.md."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from proxy_load import RATE, Held, Load, OpenLoop, Streams, pct
from proxy_targets import PROXIES, TARGETS


@dataclass(frozen=True)
class Settings:
    duration: int
    warmup: bool  # a 1 s wrk run before each measured one; a stream's length before TTFB
    ttfb_clients: int
    held: int


@dataclass
class Report:
    """Everything measured in one run."""

    machine: dict[str, str]
    settings: Settings
    loads: dict[str, dict[str, Load]] = field(default_factory=dict)  # mix -> target -> run
    latency: dict[str, OpenLoop] = field(default_factory=dict)
    ttfb: dict[str, Streams] = field(default_factory=dict)
    ttfb_cpu: dict[str, float] = field(default_factory=dict)  # target -> CPU % during TTFB
    rss: dict[str, dict[str, float]] = field(default_factory=dict)  # target -> moment -> MB
    held: dict[str, Held] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)


def table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(c) for c in col) for col in zip(headers, *rows, strict=True)]
    lines = [headers, ["-" * w for w in widths], *rows]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(ln, widths, strict=True)) for ln in lines)


def fmt(value: float, digits: int = 0) -> str:
    return "—" if math.isnan(value) else f"{value:,.{digits}f}"


# -- the tables of each phase -------------------------------------------------------------------


def throughput_tables(r: Report) -> str:
    """Each wrk run, then gpugate's req/s as a fraction of each other target's."""
    rows = []
    for mix, loads in r.loads.items():
        for target, load in loads.items():
            rows.append([mix, target, fmt(load.rps), fmt(load.p50_ms, 2), fmt(load.p99_ms, 2)])
            rows[-1] += [fmt(load.cpu_us), str(load.non_2xx), str(load.socket_errors)]
    headers = ["mix", "target", "req/s", "p50 ms", "p99 ms", "CPU µs/req", "non-2xx", "sock err"]
    ratios = [
        [mix, *(f"{loads['gpugate'].rps / loads[t].rps:.3f}" for t in ("direct", "nginx", "bare"))]
        for mix, loads in r.loads.items()
    ]
    ratio_headers = ["mix", "gpugate/direct", "gpugate/nginx", "gpugate/bare"]
    return table(headers, rows) + "\n\n" + table(ratio_headers, ratios)


def latency_table(r: Report) -> str:
    """The open loop per target, the latency it added over direct, and gpugate's own overhead."""
    base = r.latency["direct"].latency_ms
    rows = []
    for target, lat in r.latency.items():
        added = [
            "" if target == "direct" else f"{pct(lat.latency_ms, q) - pct(base, q):+.2f}"
            for q in (50, 99)
        ]
        rows.append(
            [target, str(len(lat.latency_ms)), fmt(lat.sent_rps), fmt(pct(lat.late_ms, 99), 2)]
            + [fmt(pct(lat.latency_ms, q), 2) for q in (50, 99)]
            + [*added, str(lat.errors)]
        )
    headers = ["target", "n", "sent/s", "late p99", "p50 ms", "p99 ms", "+p50", "+p99", "errors"]
    gw = r.latency["gpugate"].overhead_ms
    overhead = f"median {fmt(pct(gw, 50), 3)}, p99 {fmt(pct(gw, 99), 3)}"
    return table(headers, rows) + f"\ngpugate X-Gateway-Overhead-Ms: {overhead}"


def ttfb_table(r: Report) -> str:
    """Time to first byte of the slow streams per target, and the target's CPU meanwhile."""
    duration, rows = r.settings.duration, []
    for target, streams in r.ttfb.items():
        busy = "—" if target == "direct" else fmt(r.ttfb_cpu[target])
        rows.append(
            [target, str(len(streams.ttfb_ms)), fmt(len(streams.ttfb_ms) / duration)]
            + [fmt(pct(streams.ttfb_ms, q), 2) for q in (50, 99, 100)]
            + [busy, str(streams.errors)]
        )
    headers = ["target", "streams", "streams/s", "p50 ms", "p99 ms", "max ms", "CPU %", "errors"]
    return table(headers, rows)


def held_table(r: Report) -> str:
    """Each proxy's memory idle, after load and with the long streams open."""
    count, rows = r.settings.held, []
    for target in PROXIES:
        rss, held = r.rss[target], r.held[target]
        rows.append([target, *(fmt(rss[m], 1) for m in ("idle", "loaded", "streams"))])
        rows[-1] += [f"{held.opened}/{count}", fmt(held.open_s, 2), str(held.left_open)]
    headers = ["target", "idle MB", "after load MB", f"{count:,} streams MB", "opened", "open s"]
    return table([*headers, "upstream streams left 5 s after close"], rows)


# -- the summary --------------------------------------------------------------------------------


def verdicts(r: Report) -> list[tuple[str, str, bool]]:
    """Each target: what it asks, what was measured, met or not."""
    chat, s = r.loads["chat"], r.settings
    gw = chat["gpugate"].rps
    direct = r.latency["direct"].latency_ms
    added = [pct(r.latency["gpugate"].latency_ms, q) - pct(direct, q) for q in (50, 99)]
    streams = r.loads["sse"]["gpugate"].rps
    ttfb = pct(r.ttfb["gpugate"].ttfb_ms, 99)
    rss = r.rss["gpugate"]["streams"]
    vs_bare, vs_nginx = gw / chat["bare"].rps, gw / chat["nginx"].rps
    return [
        ("≥ 6,000 req/s non-streaming chat at 64 conns", f"{gw:,.0f}", gw >= 6000),
        ("≥ 0.5 x the bare proxy (chat)", f"{vs_bare:.2f} x", vs_bare >= 0.5),
        ("≥ 0.1 x nginx (chat)", f"{vs_nginx:.2f} x", vs_nginx >= 0.1),
        (f"added latency p50 ≤ 1 ms at {RATE:g} req/s", f"{added[0]:+.2f} ms", added[0] <= 1),
        (f"added latency p99 ≤ 3 ms at {RATE:g} req/s", f"{added[1]:+.2f} ms", added[1] <= 3),
        ("≥ 4,000 fast streams/s", f"{streams:,.0f}", streams >= 4000),
        (f"TTFB p99 ≤ 10 ms with {s.ttfb_clients} slow streams", f"{ttfb:.2f} ms", ttfb <= 10),
        (f"RSS ≤ 100 MB with {s.held:,} open streams", f"{rss:.1f} MB", rss <= 100),
    ]


def _md(headers: list[str], rows: list[list[str]]) -> str:
    lines = [headers, ["---"] * len(headers), *rows]
    return "\n".join("| " + " | ".join(line) + " |" for line in lines)


def _pair(values: list[float], digits: int = 2) -> str:
    return " / ".join(fmt(v, digits) for v in values)


def summary_rows(r: Report) -> list[list[str]]:
    """The rows of the summary table: a measure, then each target, then gpugate's ratios."""
    rows = []
    for mix, label in (
        ("chat", "chat req/s"),
        ("embeddings", "embeddings req/s"),
        ("sse", "SSE streams/s"),
    ):
        loads = r.loads[mix]
        ratios = [f"{loads['gpugate'].rps / loads[t].rps:.3f}" for t in ("direct", "nginx", "bare")]
        rows.append([f"{label} @64 conns", *(fmt(loads[t].rps) for t in TARGETS), *ratios])
    chat, direct = r.loads["chat"], r.latency["direct"].latency_ms

    def per_target(
        label: str, cell: Callable[[str], str], targets: tuple[str, ...] = TARGETS
    ) -> None:
        rows.append([label, *(["—"] * (4 - len(targets))), *map(cell, targets), "", "", ""])

    per_target("chat p50 / p99 ms @64", lambda t: _pair([chat[t].p50_ms, chat[t].p99_ms]))
    per_target("chat CPU µs/req (target process)", lambda t: fmt(chat[t].cpu_us))
    latency = {t: [pct(r.latency[t].latency_ms, q) for q in (50, 99)] for t in TARGETS}
    per_target(f"latency p50 / p99 ms @{RATE:g} req/s", lambda t: _pair(latency[t]))
    added = {t: [latency[t][i] - pct(direct, q) for i, q in enumerate((50, 99))] for t in TARGETS}
    per_target("added p50 / p99 ms", lambda t: _pair(added[t]), ("nginx", "bare", "gpugate"))
    ttfb = {t: [pct(r.ttfb[t].ttfb_ms, q) for q in (50, 99)] for t in TARGETS}
    per_target(
        f"TTFB p50 / p99 ms, {r.settings.ttfb_clients} slow streams", lambda t: _pair(ttfb[t])
    )
    rss = {t: [r.rss[t][m] for m in ("idle", "loaded", "streams")] for t in PROXIES}
    label = f"RSS MB idle / after load / {r.settings.held:,} streams"
    per_target(label, lambda t: _pair(rss[t], 1), ("nginx", "bare", "gpugate"))
    return rows


def print_summary(r: Report) -> None:
    m = r.machine
    print("\n== Summary (Markdown, for BENCHMARKS.md) ==\n")
    print(
        f"{m['date']} · {m['nproc']} cores · Python {m['python']} · nginx {m['nginx']} ·"
        f" {m['wrk']} · {r.settings.duration} s per run, loopback, one process per target\n"
    )
    headers = ["", *TARGETS, "gpugate/direct", "gpugate/nginx", "gpugate/bare"]
    print(_md(headers, summary_rows(r)))
    print()
    print(_md(["target", "measured", ""], [[a, b, "✓" if ok else "✗"] for a, b, ok in verdicts(r)]))
    overhead = r.latency["gpugate"].overhead_ms
    print(
        f"\ngpugate's own `X-Gateway-Overhead-Ms` at {RATE:g} req/s: median"
        f" {fmt(pct(overhead, 50), 3)} ms, p99 {fmt(pct(overhead, 99), 3)} ms."
    )
