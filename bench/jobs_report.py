"""The job benchmark's report: what one run measured per backend, its tables, the targets and
the Markdown summary for BENCHMARKS.md."""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable
from dataclasses import dataclass, field

from jobs_bare import CLAIM_BATCH, Bare
from jobs_load import Timeline
from proxy_load import pct
from proxy_report import fmt, table

TARGET_RATE = 1000.0  # jobs/s end to end, each backend
TARGET_DISPATCH_MS = 10.0  # create -> submitted, p50, idle


@dataclass(frozen=True)
class Settings:
    jobs: int
    concurrency: int
    warmup: int
    idle_jobs: int
    idle_pause_s: float


@dataclass(frozen=True)
class EndToEnd:
    """N jobs through the gateway: created over HTTP, dispatched, completed."""

    jobs: int
    create_s: float  # first POST -> last 202
    moments: dict[str, list[float]]  # created/submitted/completed -> s after the first POST
    gateway_cpu: tuple[float, float]  # CPU s of the gateway until the last 202, then after
    client_cpu_s: float
    problems: list[str]
    store_thread_s: float  # of the gateway's CPU: its threads but the event loop's (SQLite's)

    @property
    def gateway_cpu_s(self) -> float:
        return sum(self.gateway_cpu)

    def cpu_split(self) -> str:
        """The gateway's CPU per job while the creates came in, and per job dispatched after."""
        during = self.by("submitted", self.create_s)
        creating, after = self.gateway_cpu
        per_after = after / (self.jobs - during) * 1e6 if during < self.jobs else math.nan
        store = self.store_thread_s / self.jobs * 1e6
        loop = (self.gateway_cpu_s - self.store_thread_s) / self.jobs * 1e6
        return (
            f"gateway CPU {fmt(creating / self.jobs * 1e6)} µs per job created"
            f" (with {during:,} dispatched meanwhile), then {fmt(per_after)} µs per job"
            f" dispatched and completed; per job {fmt(loop)} µs on the event loop's side,"
            f" {fmt(store)} µs on its other threads (SQLite: the store's)"
        )

    @property
    def total_s(self) -> float:
        """First POST -> the last job's ``finished_at``."""
        return self.moments["completed"][-1]

    def by(self, name: str, second: float) -> int:
        """How many jobs were created/submitted/completed ``second`` s after the first POST."""
        return bisect.bisect_right(self.moments[name], second)

    def timeline(self) -> str:
        """Whether the dispatcher kept up with the creates, or a queue built up behind it."""
        end, last = self.create_s, self.moments["submitted"][-1]
        during, after = self.by("submitted", end), self.jobs - self.by("submitted", end)
        after_rate = after / (last - end) if last > end else math.nan
        return (
            f"last 202 at {end:.2f} s: by then {during:,} submitted, "
            f"{self.by('completed', end):,} completed ({during / end:,.0f} dispatched/s);"
            f" the other {after:,} submitted by {last:.2f} s ({fmt(after_rate)}/s),"
            f" last completed at {self.total_s:.2f} s"
        )

    @property
    def rate(self) -> float:
        return self.jobs / self.total_s

    @property
    def create_rate(self) -> float:
        return self.jobs / self.create_s


@dataclass
class Result:
    """One backend's run."""

    backend: str
    version: str
    bare: Bare
    e2e: EndToEnd
    idle: list[Timeline] = field(default_factory=list)
    overlaps: int = 0  # idle jobs created before the previous one completed

    def ms(self, what: str, q: float) -> float:
        return pct([getattr(t, what) for t in self.idle], q)

    @property
    def ratio(self) -> float:
        return self.e2e.rate / self.bare.rate


def backend_report(r: Result) -> str:
    """The tables of one backend, printed as soon as it is measured."""
    b, e = r.bare, r.e2e
    bare = [
        ["bare SQL", fmt(b.insert_rate), fmt(b.claim_complete_rate), fmt(b.rate), "—", "—"],
        [
            "gpugate",
            fmt(e.create_rate),
            "—",
            fmt(e.rate),
            f"{e.gateway_cpu_s / e.total_s:.0%}",
            fmt(e.gateway_cpu_s / e.jobs * 1e6),
        ],
    ]
    headers = ["", "insert|create/s", "claim+complete/s", "jobs/s", "gw CPU", "gw CPU µs/job"]
    lines = [
        f"\n== {r.backend} ({r.version}) ==",
        table(headers, bare),
        f"gpugate/bare: {r.ratio:.3f}   ({e.jobs:,} jobs in {e.total_s:.2f} s end to end;"
        f" bench client CPU {e.client_cpu_s:.1f} s; exactly once: "
        + ("yes" if not e.problems else "; ".join(e.problems))
        + ")",
        "timeline: " + e.timeline(),
        e.cpu_split(),
    ]
    rows = [
        [name, fmt(r.ms(attr, 50), 2), fmt(r.ms(attr, 90), 2), fmt(r.ms(attr, 99), 2)]
        for name, attr in (
            ("POST round trip (client)", "post_ms"),
            ("queued -> dispatching", "dispatching_ms"),
            ("queued -> submitted", "submitted_ms"),
            ("queued -> completed", "completed_ms"),
        )
    ]
    lines.append(f"idle, {len(r.idle)} jobs one at a time ({r.overlaps} overlapping):")
    lines.append(table(["", "p50 ms", "p90 ms", "p99 ms"], rows))
    return "\n".join(lines)


def verdicts(results: list[Result]) -> list[tuple[str, str, bool]]:
    out = []
    for r in results:
        rate, p50 = r.e2e.rate, r.ms("submitted_ms", 50)
        out.append(
            (f"{r.backend}: end to end ≥ {TARGET_RATE:,.0f} jobs/s", fmt(rate), rate >= TARGET_RATE)
        )
        out.append(
            (
                f"{r.backend}: create→dispatch p50 ≤ {TARGET_DISPATCH_MS:g} ms idle",
                f"{fmt(p50, 2)} ms (p99 {fmt(r.ms('submitted_ms', 99), 2)} ms)",
                p50 <= TARGET_DISPATCH_MS,
            )
        )
        once = (
            "every job completed, submit_count 1"
            if not r.e2e.problems
            else "; ".join(r.e2e.problems)
        )
        out.append((f"{r.backend}: each job exactly once", once, not r.e2e.problems))
    return out


def print_targets(results: list[Result]) -> None:
    print("\n== Targets ==")
    for name, measured, ok in verdicts(results):
        print(f"  {'✓' if ok else '✗'} {name}: {measured}")


def _md(headers: list[str], rows: list[list[str]]) -> str:
    lines = [headers, ["---"] * len(headers), *rows]
    return "\n".join("| " + " | ".join(line) + " |" for line in lines)


def summary_rows(results: list[Result]) -> list[list[str]]:
    def row(name: str, cell: Callable[[Result], str]) -> list[str]:
        return [name, *(cell(r) for r in results)]

    return [
        row(f"bare SQL lifecycle (claim {CLAIM_BATCH}), jobs/s", lambda r: fmt(r.bare.rate)),
        row("gpugate end to end, jobs/s", lambda r: fmt(r.e2e.rate)),
        row("gpugate / bare", lambda r: f"{r.ratio:.3f}"),
        row("gpugate create (POST → 202), jobs/s", lambda r: fmt(r.e2e.create_rate)),
        row("gateway CPU per job, µs", lambda r: fmt(r.e2e.gateway_cpu_s / r.e2e.jobs * 1e6)),
        row(
            "create → submitted, idle, p50 / p99 ms",
            lambda r: f"{fmt(r.ms('submitted_ms', 50), 2)} / {fmt(r.ms('submitted_ms', 99), 2)}",
        ),
        row("create → completed, idle, p50 ms", lambda r: fmt(r.ms("completed_ms", 50), 2)),
    ]


def print_summary(machine: dict[str, str], settings: Settings, results: list[Result]) -> None:
    m = machine
    print("\n== Summary (Markdown, for BENCHMARKS.md) ==\n")
    print(
        f"{m['date']} · {m['nproc']} cores ({m['cpu']}) · Python {m['python']} ·"
        f" {' · '.join(r.version for r in results)} · {settings.jobs:,} jobs,"
        f" {settings.concurrency} creates in flight, one `gpugate serve`, loopback\n"
    )
    print(_md(["", *(r.backend for r in results)], summary_rows(results)))
    print()
    rows = [[a, b, "✓" if ok else "✗"] for a, b, ok in verdicts(results)]
    print(_md(["target", "measured", ""], rows))
