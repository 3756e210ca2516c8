"""The console's charts, drawn on the server as SVG: geometry here, markup in ``_chart.html``.

A chart is plain data for the template — title, unit, the plot box, y ticks (3 to 5, from 0 to a
round top), x ticks (time labels spaced by their own width, so they never overlap or wrap),
one path per series (broken where samples are missing), shaded bands (a GPU fault) and a legend
with each series' latest value. The viewBox is fixed and the SVG is drawn at the full width of its
box by CSS; no script draws anything (the console's Content-Security-Policy allows no inline
style or script, and a screenshot shows exactly what the server sent; docs/decisions.md).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

Point = tuple[float, float]  # (unix time, value)

WIDTH, HEIGHT = 600.0, 200.0
LEFT, RIGHT, TOP, BOTTOM = 72.0, 16.0, 12.0, 24.0  # room for the y labels and the x labels
CHAR_W = 7.0  # a generous width of one 11 px character: labels are spaced by it
MIN_SPAN_S = 60.0
COLOURS = 8  # series classes s0..s7 in console.css
MAX_POINTS = 260  # per line: about one per 2 units of the plot's width
_TIME_STEPS = (5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200)
_NICE = (1.0, 2.0, 2.5, 5.0, 10.0)


@dataclass(frozen=True, slots=True)
class Band:
    """A stretch of time to shade (``start``..``end``, unix time) with what it was."""

    start: float
    end: float
    label: str


@dataclass(slots=True)
class Chart:
    """Everything ``_chart.html`` draws."""

    id: str
    title: str
    unit: str
    width: float = WIDTH
    height: float = HEIGHT
    box: tuple[float, float, float, float] = (LEFT, TOP, WIDTH - RIGHT, HEIGHT - BOTTOM)
    y_ticks: list[dict[str, Any]] = field(default_factory=list)
    x_ticks: list[dict[str, Any]] = field(default_factory=list)
    lines: list[dict[str, Any]] = field(default_factory=list)
    bars: list[dict[str, Any]] = field(default_factory=list)
    rules: list[dict[str, Any]] = field(default_factory=list)  # horizontal lines (a budget)
    bands: list[dict[str, Any]] = field(default_factory=list)
    legend: list[dict[str, str]] = field(default_factory=list)
    empty: str | None = None


def number(value: float, unit: str = "") -> str:
    """A value as a tick or legend shows it: dollars with cents, else at most 2 decimals."""
    if unit == "$":
        return f"${value:,.2f}"
    text = f"{value:,.2f}".rstrip("0").rstrip(".") if abs(value) < 100 else f"{value:,.0f}"
    return "0" if text in ("-0", "") else text


def nice_top(top: float) -> tuple[float, float]:
    """A round top at or above ``top`` and its tick step, with 3 to 5 ticks from 0."""
    top = max(top, 1e-9)
    magnitude = 10.0 ** math.floor(math.log10(top / 4))
    for nice in (*_NICE, 20.0):
        step = nice * magnitude
        if top / step <= 4:
            return step * max(2, math.ceil(top / step - 1e-9)), step
    return 4 * step, step  # pragma: no cover - 20 x magnitude always covers top / 4


def _y_ticks(chart: Chart, top: float, step: float) -> None:
    x0, y0, _, y1 = chart.box
    n = round(top / step)
    chart.y_ticks = [
        {"y": y1 - (y1 - y0) * i / n, "label": number(i * step, chart.unit), "x": x0 - 6}
        for i in range(n + 1)
    ]


def _clock_label(t: float, step: int) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%H:%M:%S" if step < 60 else "%H:%M")


def _x_ticks(chart: Chart, t0: float, t1: float) -> None:
    """Time labels at round times, spaced at least their own width plus a gap apart."""
    x0, _, x1, _ = chart.box
    label_w = CHAR_W * 8  # HH:MM:SS
    fits = max(2, int((x1 - x0) // (label_w + 2 * CHAR_W)))
    step = next((s for s in _TIME_STEPS if (t1 - t0) / s <= fits), _TIME_STEPS[-1])
    first = math.ceil(t0 / step) * step
    ticks = []
    t = float(first)
    while t <= t1:
        x = x0 + (x1 - x0) * (t - t0) / (t1 - t0)
        label = _clock_label(t, step)
        half = CHAR_W * len(label) / 2
        if x - half >= x0 - 4 and x + half <= chart.width - 2:  # clear of the y labels
            ticks.append({"x": x, "label": label})
        t += step
    chart.x_ticks = ticks


def line_chart(  # noqa: PLR0913 - a chart's parts, each named at the call
    chart_id: str,
    title: str,
    unit: str,
    series: Mapping[str, Sequence[Point]],
    *,
    span: tuple[float, float] | None,
    gap_s: float,
    bands: Sequence[Band] = (),
    min_top: float = 1.0,
    labels: Mapping[str, str] | None = None,
    rules: Sequence[tuple[str, float]] = (),
    classes: Mapping[str, str] | None = None,
) -> Chart:
    """Lines over time from ``span[0]`` to ``span[1]`` (at least :data:`MIN_SPAN_S`); a gap
    longer than ``gap_s`` between two samples breaks a line; ``classes`` pins a series'
    colour (``s0``..``s7``, ``ok``), the others take them in turn."""
    chart = Chart(chart_id, title, unit)
    now = span[1] if span else 0.0
    t0 = span[0] if span else now - MIN_SPAN_S
    t1 = max(now, t0 + MIN_SPAN_S)
    values = [v for points in series.values() for _, v in points]
    top, step = nice_top(max([min_top, *values, *(v for _, v in rules)]))
    _y_ticks(chart, top, step)
    _x_ticks(chart, t0, t1)
    x0, y0, x1, y1 = chart.box

    def xy(t: float, v: float) -> tuple[float, float]:
        return x0 + (x1 - x0) * (t - t0) / (t1 - t0), y1 - (y1 - y0) * v / top

    for i, (key, points) in enumerate(sorted(series.items())):
        cls = (classes or {}).get(key, f"s{i % COLOURS}")
        shown = thin(points, t0, t1, MAX_POINTS)
        joined = max(gap_s, 2 * (t1 - t0) / MAX_POINTS) if len(shown) < len(points) else gap_s
        chart.lines.append({"cls": cls, "key": key, **_path(shown, xy, joined)})
        last = number(points[-1][1], unit) + _suffix(unit) if points else ""
        chart.legend.append({"cls": cls, "label": (labels or {}).get(key, key), "last": last})
    for band in bands:
        start, end = max(band.start, t0), min(band.end, t1)
        if end >= start:
            (bx, _), (ex, _) = xy(start, 0), xy(end, 0)
            width = min(max(ex - bx, 2.0), x1 - bx)
            chart.bands.append({"x": bx, "y": y0, "w": width, "h": y1 - y0, "label": band.label})
    _rules(chart, rules, top)
    if not values:
        chart.empty = "no samples yet" if span is None else "nothing to show in this window"
    return chart


def thin(points: Sequence[Point], t0: float, t1: float, most: int) -> list[Point]:
    """At most about ``most`` points: one per slice of time, the slice's highest (a spike stays
    visible); ``points`` as they are when there are few enough."""
    if len(points) <= most or t1 <= t0:
        return list(points)
    width = (t1 - t0) / most
    kept: list[Point] = []
    current = None
    for t, v in points:
        slot = int((t - t0) // width)
        if slot != current:
            kept.append((t, v))
            current = slot
        elif v > kept[-1][1]:
            kept[-1] = (t, v)
    return kept


def _path(
    points: Sequence[Point], xy: Callable[[float, float], tuple[float, float]], gap_s: float
) -> dict[str, Any]:
    """An SVG path through ``points``, a new stroke (``M``) after a gap longer than ``gap_s``,
    and a dot for each point that no stroke reaches (no neighbour within ``gap_s``)."""
    path, dots = [], []
    times = [t for t, _ in points]
    for i, (t, v) in enumerate(points):
        x, y = xy(t, v)
        joined_before = i > 0 and t - times[i - 1] <= gap_s
        joined_after = i + 1 < len(times) and times[i + 1] - t <= gap_s
        path.append(f"{'L' if joined_before else 'M'}{x:.1f},{y:.1f}")
        if not joined_before and not joined_after:
            dots.append({"x": x, "y": y})
    return {"d": "".join(path), "dots": dots}


def _rules(chart: Chart, rules: Sequence[tuple[str, float]], top: float) -> None:
    """Horizontal lines at ``rules``' values (a budget), each in the legend."""
    _, y0, _, y1 = chart.box
    for i, (label, value) in enumerate(rules):
        y = y1 - (y1 - y0) * value / top
        shown = number(value, chart.unit)
        chart.rules.append({"y": y, "cls": f"rule{i}", "label": f"{label} {shown}"})
        chart.legend.append({"cls": f"rule{i}", "label": label, "last": shown})


def _suffix(unit: str) -> str:
    return "" if unit in ("", "$") else (unit if unit in ("%", "°C") else f" {unit}")


def bar_chart(
    chart_id: str,
    title: str,
    unit: str,
    bars: Sequence[tuple[str, float]],
    *,
    rules: Sequence[tuple[str, float]] = (),
) -> Chart:
    """One bar per ``(label, value)`` across the whole plot, with horizontal ``rules`` (a daily
    budget); every label shown when they fit under their bars, else every second or third."""
    chart = Chart(chart_id, title, unit)
    top, step = nice_top(max([v for _, v in bars] + [v for _, v in rules] + [0.01]))
    _y_ticks(chart, top, step)
    x0, y0, x1, y1 = chart.box
    slot = (x1 - x0) / max(1, len(bars))
    widest = max((len(label) for label, _ in bars), default=1) * CHAR_W + CHAR_W
    every = max(1, math.ceil(widest / slot))
    for i, (label, value) in enumerate(bars):
        h = (y1 - y0) * value / top
        x = x0 + slot * i + slot * 0.15
        tip = f"{label}: {number(value, unit)}"
        chart.bars.append({"x": x, "y": y1 - h, "w": slot * 0.7, "h": h, "title": tip})
        if (len(bars) - 1 - i) % every == 0:  # the newest day always has its label
            chart.x_ticks.append({"x": x + slot * 0.35, "label": label})
    _rules(chart, rules, top)
    if not any(v for _, v in bars):
        chart.empty = "no spend recorded yet"
    return chart
