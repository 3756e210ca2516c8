"""The proxy benchmark's report: what one run measured, its tables, ratios and targets, and the
Markdown summary for BENCHMARKS.md."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from proxy_load import BURST, RATE, Bursts, Held, Load, OpenLoop, Streams, pct

PEER, BARE = "vllm-router", "bare"


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
    targets: tuple[str, ...] = ()
    proxies: tuple[str, ...] = ()
    cores: str = ""
    loads: dict[str, dict[str, Load]] = field(default_factory=dict)  # mix -> target -> run
    bursts: dict[str, Bursts] = field(default_factory=dict)
    latency: dict[str, OpenLoop] = field(default_factory=dict)
    ttfb: dict[str, Streams] = field(default_factory=dict)
    ttfb_cpu: dict[str, float] = field(default_factory=dict)  # target -> CPU % during TTFB
    #: target -> CPU µs per request during the bursts (a burst's last answer waits ~64 of them)
    bursts_cpu_us: dict[str, float] = field(default_factory=dict)
    rss: dict[str, dict[str, float]] = field(default_factory=dict)  # target -> moment -> MB
    held: dict[str, Held] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    #: gpugate / gpugate-p2c req/s, medians of rounds of both loaded at once, per mix (#18)
    routing: dict[str, float] = field(default_factory=dict)
    #: the picker's µs per request in process, per policy, 2 endpoints (issue #18)
    picker_us: dict[str, float] = field(default_factory=dict)
    #: keys' req/s as a share of open's: "chat keys", "sse keys+limits", ... (issue #16)
    keys: dict[str, float] = field(default_factory=dict)
    #: gpugate-x2 / gpugate, both on every core, medians of alternated pairs, per mix (#21)
    workers: dict[str, float] = field(default_factory=dict)
    baseline: str = ""  # the commit of gpugate-base, when measured

    def ratio(self, mix: str, target: str, base: str) -> float:
        loads = self.loads.get(mix, {})
        if target not in loads or base not in loads:
            return math.nan
        return loads[target].rps / loads[base].rps

    def added(self, target: str, q: float, *, bursts: bool = True) -> float:
        """Latency added over direct at the ``q``-th percentile (paced bursts or open loop)."""
        runs: dict[str, Bursts] | dict[str, OpenLoop] = self.bursts if bursts else self.latency
        if target not in runs or "direct" not in runs:
            return math.nan
        return pct(runs[target].latency_ms, q) - pct(runs["direct"].latency_ms, q)


def table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(c) for c in col) for col in zip(headers, *rows, strict=True)]
    lines = [headers, ["-" * w for w in widths], *rows]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(ln, widths, strict=True)) for ln in lines)


def fmt(value: float, digits: int = 0) -> str:
    return "—" if math.isnan(value) else f"{value:,.{digits}f}"


def _x(value: float) -> str:
    return "—" if math.isnan(value) else f"{value:.2f}x"


# -- the tables of each phase -------------------------------------------------------------------


def throughput_tables(r: Report) -> str:
    """Each wrk run, then each proxy's req/s as a multiple of the router's and the bare one's."""
    rows = []
    for mix, loads in r.loads.items():
        for target, load in loads.items():
            rows.append([mix, target, fmt(load.rps), fmt(load.p50_ms, 2), fmt(load.p99_ms, 2)])
            rows[-1] += [fmt(load.cpu_us), str(load.non_2xx), str(load.socket_errors)]
    headers = ["mix", "target", "req/s", "p50 ms", "p99 ms", "CPU µs/req", "non-2xx", "sock err"]
    mixes = list(r.loads)
    ratio_rows = [
        [t, *(_x(r.ratio(mix, t, base)) for mix in mixes for base in (PEER, BARE))]
        for t in r.targets
        if t not in ("direct", PEER)
    ]
    ratio_headers = ["target", *(f"{mix} /{base}" for mix in mixes for base in ("router", BARE))]
    text = table(headers, rows) + "\n\n" + table(ratio_headers, ratio_rows)
    routed = [
        f"{mix} {_x(r.ratio(mix, 'gpugate', 'gpugate-p2c'))}"
        for mix, loads in r.loads.items()
        if "gpugate" in loads and "gpugate-p2c" in loads
    ]
    if routed:  # issue #18: the default routing against wave 1's picker, req/s
        text += "\n\ngpugate (prefix_affinity) / gpugate-p2c (least_outstanding): " + ", ".join(
            routed
        )
    return text


def bursts_table(r: Report) -> str:
    """The paced bursts per target and the latency each added over direct."""
    rows = []
    for target, b in r.bursts.items():
        added = ["" if target == "direct" else f"{r.added(target, q):+.2f}" for q in (50, 99)]
        rows.append(
            [target, str(len(b.latency_ms)), str(b.bursts), fmt(pct(b.late_ms, 99), 2)]
            + [fmt(pct(b.latency_ms, q), 2) for q in (50, 99, 100)]
            + [*added, _burst_cpu(r, target), str(b.busy), str(b.errors)]
        )
    headers = ["target", "n", "bursts", "late p99", "p50 ms", "p99 ms", "max ms", "+p50", "+p99"]
    return table([*headers, "CPU µs/req", "busy", "errors"], rows)


def _burst_cpu(r: Report, target: str) -> str:
    """The target's CPU per request during its bursts, ``—`` for the fake upstream itself."""
    return (
        "—" if target == "direct" or target not in r.bursts_cpu_us else fmt(r.bursts_cpu_us[target])
    )


def latency_table(r: Report) -> str:
    """The open loop per target, the latency it added over direct, and gpugate's own overhead."""
    rows = []
    for target, lat in r.latency.items():
        added = [
            "" if target == "direct" else f"{r.added(target, q, bursts=False):+.2f}"
            for q in (50, 99)
        ]
        rows.append(
            [target, str(len(lat.latency_ms)), fmt(lat.sent_rps), fmt(pct(lat.late_ms, 99), 2)]
            + [fmt(pct(lat.latency_ms, q), 2) for q in (50, 99)]
            + [*added, str(lat.errors)]
        )
    headers = ["target", "n", "sent/s", "late p99", "p50 ms", "p99 ms", "+p50", "+p99", "errors"]
    text = table(headers, rows)
    if "gpugate" in r.latency:
        gw = r.latency["gpugate"].overhead_ms
        overhead = f"median {fmt(pct(gw, 50), 3)}, p99 {fmt(pct(gw, 99), 3)}"
        text += f"\ngpugate X-Gateway-Overhead-Ms: {overhead}"
    return text


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
    for target in r.proxies:
        rss, held = r.rss[target], r.held[target]
        rows.append([target, *(fmt(rss[m], 1) for m in ("idle", "loaded", "streams"))])
        rows[-1] += [f"{held.opened}/{count}", fmt(held.open_s, 2), str(held.left_open)]
    headers = ["target", "idle MB", "after load MB", f"{count:,} streams MB", "opened", "open s"]
    return table([*headers, "upstream streams left 5 s after close"], rows)


# -- the targets of issue #21 -------------------------------------------------------------------


def verdicts(r: Report, target: str) -> list[tuple[str, str, bool]]:
    """Each target of #21 for ``target``: what it asks, what was measured, met or not."""
    chat, sse = r.ratio("chat", target, PEER), r.ratio("sse", target, PEER)
    p99, peer_p99 = r.added(target, 99), r.added(PEER, 99)
    rss = r.rss.get(target, {}).get("streams", math.nan)
    held = r.settings.held
    return [
        ("chat req/s ≥ 0.5x vllm-router", _x(chat), chat >= 0.5),
        (
            f"added p99, bursts of {BURST} at {RATE:g} req/s ≤ router's + 1 ms",
            f"{p99:+.2f} vs {peer_p99:+.2f} ms",
            p99 <= peer_p99 + 1,
        ),
        ("SSE streams/s ≥ 1x vllm-router", _x(sse), sse >= 1),
        (f"RSS ≤ 100 MB with {held:,} open streams", f"{rss:.1f} MB", rss <= 100),
    ]


def _mark(ok: bool) -> str:
    return "✓" if ok else "✗"


def done_when_rows(r: Report) -> list[list[str]]:
    """The verdict per done-when this run judges: issue, what it asks, the figures, ✓/✗."""
    rows: list[list[str]] = []
    if PEER in r.targets and "gpugate" in r.targets:
        for ask, got, ok in verdicts(r, "gpugate"):
            rows.append(["#21 DW1", ask, got, _mark(ok)])
    if r.workers:
        got = ", ".join(f"{mix} {v:.2f}x" for mix, v in r.workers.items())
        rows.append(["#21 DW2", "--workers 2 beats one worker (both on every core)", got,
                     _mark(all(v > 1 for v in r.workers.values()))])  # fmt: skip
    if "gpugate-base" in r.targets and "gpugate" in r.targets and BARE in r.targets:
        for mix in ("chat", "sse"):
            now, then = r.ratio(mix, "gpugate", BARE), r.ratio(mix, "gpugate-base", BARE)
            rows.append([
                "#13 DW4", f"{mix} req/s within 5 % of {r.baseline[:7]}'s (each x bare)",
                f"{now:.2f}x bare vs {then:.2f}x ({now / then:.1%})", _mark(now >= 0.95 * then),
            ])  # fmt: skip
        now_p99, then_p99 = r.added("gpugate", 99), r.added("gpugate-base", 99)
        rows.append([
            "#13 DW4", f"added p99, bursts, within 5 % of {r.baseline[:7]}'s",
            f"{now_p99:+.2f} vs {then_p99:+.2f} ms", _mark(now_p99 <= then_p99 * 1.05),
        ])  # fmt: skip
    for name, share in r.keys.items():
        rows.append(["#16 DW5", f"{name}: ≥ 90 % of open's req/s", f"{share:.1%}",
                     _mark(share >= 0.9)])  # fmt: skip
    if r.routing:
        picker = ", ".join(f"{k} {v:.1f} µs" for k, v in r.picker_us.items())
        for mix, ratio in r.routing.items():
            rows.append([
                "#18 DW4", f"{mix}: prefix_affinity ≥ 0.90x least_outstanding req/s",
                f"{ratio:.3f}x (picker: {picker})", _mark(ratio >= 0.9),
            ])  # fmt: skip
    return rows


def _md(headers: list[str], rows: list[list[str]]) -> str:
    lines = [headers, ["---"] * len(headers), *rows]
    return "\n".join("| " + " | ".join(line) + " |" for line in lines)


def _pair(values: list[float], digits: int = 2) -> str:
    return " / ".join(fmt(v, digits) for v in values)


def summary_rows(r: Report) -> list[list[str]]:
    """One row per target: what it did, and its multiples of the router and the bare proxy."""
    rows = []
    for t in r.targets:
        loads = {mix: r.loads.get(mix, {}).get(t) for mix in ("chat", "embeddings", "sse")}
        rps = {mix: load.rps if load else math.nan for mix, load in loads.items()}
        cpu = loads["chat"].cpu_us if loads["chat"] else math.nan
        peer = t in ("direct", PEER)
        rss = r.rss.get(t, {})
        ttfb = r.ttfb.get(t)
        rows.append(
            [
                t,
                fmt(rps["chat"]),
                "" if peer else _x(r.ratio("chat", t, PEER)),
                "" if t in ("direct", BARE) else _x(r.ratio("chat", t, BARE)),
                fmt(rps["sse"]),
                "" if peer else _x(r.ratio("sse", t, PEER)),
                fmt(rps["embeddings"]),
                fmt(cpu),
                "—" if t == "direct" else _pair([r.added(t, 50), r.added(t, 99)]),
                "—" if t == "direct" else _pair([r.added(t, q, bursts=False) for q in (50, 99)]),
                fmt(pct(ttfb.ttfb_ms, 99), 2) if ttfb else "—",
                _pair([rss.get(m, math.nan) for m in ("idle", "loaded", "streams")], 1)
                if rss
                else "—",
            ]
        )
    return rows


SUMMARY_HEADERS = [
    "target",
    "chat req/s",
    "x router",
    "x bare",
    "SSE streams/s",
    "x router",
    "embeddings req/s",
    "chat CPU µs/req",
    f"added p50 / p99 ms, bursts of {BURST} at {RATE:g}/s",
    f"added p50 / p99 ms, open loop {RATE:g}/s",
    "TTFB p99 ms, slow streams",
    "RSS MB idle / loaded / streams",
]


def print_summary(r: Report) -> None:
    m = r.machine
    print("\n== Summary (Markdown, for BENCHMARKS.md) ==\n")
    print(
        f"{m['date']} · {m['nproc']} cores · Python {m['python']} · nginx {m['nginx']} ·"
        f" {m['wrk']} · vllm-router {m.get('vllm-router', '—')} · {r.settings.duration} s"
        f" per run, loopback · cores: {r.cores}\n"
    )
    print(_md(SUMMARY_HEADERS, summary_rows(r)))
    judged = [t for t in r.targets if t not in ("direct", "nginx", PEER, BARE)]
    if PEER in r.targets and judged:
        print("\nThe targets of issue #21, against vllm-router in this run:\n")
        marks = {t: verdicts(r, t) for t in judged}
        asks = [ask for ask, _, _ in marks[judged[0]]]
        rows = [
            [ask, *(f"{marks[t][i][1]} {'✓' if marks[t][i][2] else '✗'}" for t in judged)]
            for i, ask in enumerate(asks)
        ]
        print(_md(["target of #21", *judged], rows))
    if verdict := done_when_rows(r):
        print("\nThe done-whens this run judges:\n")
        print(_md(["issue", "asks", "measured", ""], verdict))
    if "gpugate" in r.latency:
        overhead = r.latency["gpugate"].overhead_ms
        print(
            f"\ngpugate's own `X-Gateway-Overhead-Ms` at {RATE:g} req/s: median"
            f" {fmt(pct(overhead, 50), 3)} ms, p99 {fmt(pct(overhead, 99), 3)} ms."
        )
