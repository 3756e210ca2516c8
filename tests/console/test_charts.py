"""The console's SVG charts: readable axes, lines broken at gaps, bars across the whole plot."""

from __future__ import annotations

import itertools

from gpugate.web.console.charts import (
    CHAR_W,
    Band,
    bar_chart,
    line_chart,
    nice_top,
    number,
    thin,
)

T0 = 1_767_225_600.0  # 2026-01-01 00:00:00 UTC


def test_a_round_top_gives_three_to_five_ticks_from_zero() -> None:
    for top in (0.3, 1, 7, 13, 99, 100, 101, 2345):
        nice, step = nice_top(top)
        assert nice >= top
        assert 3 <= round(nice / step) + 1 <= 5, (top, nice, step)


def test_money_is_dollars_with_cents_and_other_figures_lose_float_noise() -> None:
    assert "$0.12" == number(0.1195, "$")
    assert "$1,250.00" == number(1250, "$")
    assert "0.3" == number(0.30000000000000004)
    assert "1,234" == number(1234.4)


def test_time_labels_are_spaced_wider_than_themselves_whatever_the_window() -> None:
    for span_s in (60, 300, 900, 3600):
        points = [(T0 + t, 1.0) for t in range(0, span_s + 1, 5)]
        chart = line_chart("c", "t", "req/s", {"a": points}, span=(T0, T0 + span_s), gap_s=12)
        xs = [t["x"] for t in chart.x_ticks]
        widest = max(len(t["label"]) for t in chart.x_ticks) * CHAR_W
        assert len(xs) >= 2, span_s
        assert all(b - a > widest for a, b in itertools.pairwise(xs)), span_s


def test_a_line_breaks_where_samples_are_missing_and_a_lone_sample_is_a_dot() -> None:
    points = [(T0, 1.0), (T0 + 5, 2.0), (T0 + 60, 3.0)]
    chart = line_chart("c", "t", "ms", {"p50": points}, span=(T0, T0 + 60), gap_s=12)
    (line,) = chart.lines
    assert 2 == line["d"].count("M")
    assert 1 == len(line["dots"])
    assert "3 ms" == chart.legend[0]["last"]


def test_a_fault_is_a_shaded_band_over_its_stretch_of_the_window() -> None:
    band = Band(T0 + 30, T0 + 45, "GPU 0 faulted")
    chart = line_chart("c", "t", "%", {}, span=(T0, T0 + 60), gap_s=12, bands=[band])
    x0, _, x1, _ = chart.box
    (shaded,) = chart.bands
    assert abs(shaded["x"] - (x0 + (x1 - x0) / 2)) < 0.01
    assert abs(shaded["w"] - (x1 - x0) / 4) < 0.01
    assert chart.empty is not None  # no series: the chart says so


def test_the_bars_fill_the_plot_from_its_left_edge_to_its_right_edge() -> None:
    bars = [(f"01-{d:02}", 0.5) for d in range(1, 15)]
    chart = bar_chart("c", "spend", "$", bars)
    x0, _, x1, _ = chart.box
    slot = (x1 - x0) / 14
    assert chart.bars[0]["x"] - x0 < slot / 2
    assert x1 - (chart.bars[-1]["x"] + chart.bars[-1]["w"]) < slot / 2
    labels = [t["x"] for t in chart.x_ticks]
    assert all(b - a > 5 * CHAR_W for a, b in itertools.pairwise(labels))
    assert "01-14" == chart.x_ticks[-1]["label"]  # the newest day is always labelled


def test_a_long_line_is_thinned_to_one_point_per_slice_keeping_its_peak() -> None:
    points = [(T0 + 5 * i, 1.0) for i in range(720)]
    points[333] = (points[333][0], 50.0)  # one 5 s spike in an hour
    kept = thin(points, T0, T0 + 3595, 260)
    assert len(kept) <= 261
    assert 50.0 == max(v for _, v in kept)
    chart = line_chart("c", "t", "req/s", {"a": points}, span=(T0, T0 + 3595), gap_s=12.5)
    assert 1 == chart.lines[0]["d"].count("M")  # thinned, the line is still unbroken
