"""The console's charts in a real browser while a scenario plays (issue #19, done-when 2).

Each test starts ``gpugate demo --scenario NAME --pace S`` (steady chat traffic runs while it
plays), waits in Chromium until the incident shows on the page, screenshots it into
``test-artifacts/browser/`` and reads every chart from the DOM: each series has at least two
points, the y axis has its unit and 3 to 5 tick labels, the x axis at least two time labels, no
two labels overlap (by the boxes the browser laid out), nothing is clipped, and the plot spans
its box.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from browser_rig import Demo, log_in, require_browser, running_demo, shot

require_browser()

from playwright.sync_api import Browser, Page, expect  # noqa: E402

from gpugate.demo_scenarios import SCENARIOS  # noqa: E402

PACE_S = "8"  # each state of the scenario held 8 s (16 s for a held incident)
WAIT_MS = 90_000  # the incident shows within this on a loaded machine
TEST_TIMEOUT_S = 240  # the demo's start, the scenario's lead-in, the wait, the checks

READ_CHARTS = """(selector) =>
[...document.querySelectorAll(selector + " figure.chart")].map(fig => {
  const svg = fig.querySelector("svg.plot");
  const box = (el) => { const r = el.getBoundingClientRect();
    return {left: r.left, right: r.right, top: r.top, bottom: r.bottom, text: el.textContent}; };
  const all = (q) => [...svg.querySelectorAll(q)].map(box);
  return {
    id: fig.id,
    title: fig.querySelector(".title").textContent,
    unit: (svg.querySelector("text.unit") || {}).textContent || null,
    legend: [...fig.querySelectorAll(".legend li")].map(li => li.textContent.trim()),
    lines: [...svg.querySelectorAll("path.line")].map(p => ({
      series: p.dataset.series, points: (p.getAttribute("d").match(/[ML]/g) || []).length})),
    bars: [...svg.querySelectorAll(".bars rect")].map(r => parseFloat(r.getAttribute("height"))),
    bands: svg.querySelectorAll("rect.fault").length,
    yTicks: all(".axis.y text.tick"),
    xTicks: all(".axis.x text.tick"),
    texts: all("text"),
    svg: box(svg),
    figure: box(fig),
    xAxis: box(svg.querySelector(".axis.x line")),
  };
})"""


def _overlap(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return (
        min(a["right"], b["right"]) - max(a["left"], b["left"]) > 0.5
        and min(a["bottom"], b["bottom"]) - max(a["top"], b["top"]) > 0.5
    )


def assert_readable(chart: dict[str, Any]) -> None:
    """The axes of one chart read from the DOM can be read by a person."""
    name = chart["id"]
    assert chart["unit"], f"{name}: no unit on the y axis"
    assert 3 <= len(chart["yTicks"]) <= 5, f"{name}: {len(chart['yTicks'])} y tick labels"
    assert len(chart["xTicks"]) >= 2, f"{name}: {len(chart['xTicks'])} x tick labels"
    assert chart["legend"], f"{name}: no legend"
    texts = chart["texts"]
    for i, a in enumerate(texts):
        assert a["text"].strip(), f"{name}: an empty label"
        for b in texts[i + 1 :]:
            assert not _overlap(a, b), f"{name}: {a['text']!r} overlaps {b['text']!r}"
        svg = chart["svg"]
        inside = svg["left"] - 0.5 <= a["left"] and a["right"] <= svg["right"] + 0.5
        assert inside, f"{name}: {a['text']!r} is clipped"
    heights = {round(t["bottom"] - t["top"]) for t in chart["xTicks"]}
    assert 1 == len(heights), f"{name}: x labels of different heights (one wrapped?)"
    axis, figure = chart["xAxis"], chart["figure"]
    assert axis["right"] - axis["left"] > 0.8 * (figure["right"] - figure["left"]), (
        f"{name}: the plot is drawn in part of its box"
    )


def charts_on(page: Page, selector: str) -> dict[str, dict[str, Any]]:
    return {c["id"]: c for c in page.evaluate(READ_CHARTS, selector)}


def points(chart: dict[str, Any]) -> dict[str, int]:
    return {line["series"]: line["points"] for line in chart["lines"]}


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    tab = context.new_page()
    tab.set_default_timeout(15_000)
    yield tab
    context.close()


@pytest.fixture
def scenario(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Demo]:
    name = request.param
    if name not in SCENARIOS:
        pytest.skip(f"scenario {name!r} is not in gpugate.demo_scenarios yet (faults branch)")
    with running_demo(tmp_path, "--scenario", name, "--pace", PACE_S) as demo:
        yield demo


def wait_for_charts(page: Page, selector: str, ready: Any, what: str) -> dict[str, Any]:
    """Poll the live page (it refreshes itself) until ``ready(charts)`` holds; the charts."""
    found: dict[str, Any] = {}

    def check() -> bool:
        found.clear()
        found.update(charts_on(page, selector))
        return bool(ready(found))

    deadline_checks = WAIT_MS // 500
    for _ in range(deadline_checks):
        if check():
            return found
        page.wait_for_timeout(500)
    pytest.fail(f"{what} not on the page within {WAIT_MS // 1000} s: {found}")


def _fleet_incident_test(page: Page, demo: Demo, shot_name: str, incident: Any) -> None:
    log_in(page, demo)
    charts = wait_for_charts(page, "#fleet-charts", incident, f"{shot_name}'s incident")
    shot(page, shot_name)
    for chart_id in (
        "chart-requests",
        "chart-latency",
        "chart-ttfb",
        "chart-queue",
        "chart-gpu-util",
        "chart-gpu-temp",
    ):
        chart = charts[chart_id]
        assert_readable(chart)
        assert chart["lines"], f"{chart_id}: no series"
        assert all(n >= 2 for n in points(chart).values()), f"{chart_id}: {points(chart)}"


def _fault_and_fallbacks(charts: dict[str, Any]) -> bool:
    """A GPU fault shaded, the requests still answered (by the fallback) and the fallbacks that
    answered them charted, twice or more."""
    requests = points(charts.get("chart-requests", {"lines": []}))
    fallbacks = points(charts.get("chart-fallbacks", {"lines": []}))
    gpu = charts.get("chart-gpu-util", {"bands": 0})
    latency = charts.get("chart-latency", {"lines": []})
    return bool(
        requests.get("200", 0) >= 2
        and gpu["bands"]
        and fallbacks
        and max(fallbacks.values()) >= 2
        and latency["lines"]
        and all(n >= 2 for n in points(latency).values())
    )


@pytest.mark.timeout(TEST_TIMEOUT_S)
@pytest.mark.parametrize("scenario", ["xid"], indirect=True)
def test_the_fleet_page_during_the_xid_scenario_charts_the_fault_and_the_fallbacks(
    page: Page, scenario: Demo
) -> None:
    _fleet_incident_test(page, scenario, "10-fleet-xid", _fault_and_fallbacks)
    expect(page.locator('#gpus tr[data-gpu="fleet-node/0"]')).to_have_class("faulted")
    charts = charts_on(page, "#fleet-charts")
    assert {"fleet-node/0", "fleet-node/1"} <= set(points(charts["chart-gpu-util"]))
    assert_readable(charts["chart-fallbacks"])


@pytest.mark.timeout(TEST_TIMEOUT_S)
@pytest.mark.parametrize("scenario", ["failover"], indirect=True)
def test_the_fleet_page_during_the_failover_scenario_charts_the_fault_and_the_fallbacks(
    page: Page, scenario: Demo
) -> None:
    _fleet_incident_test(page, scenario, "11-fleet-failover", _fault_and_fallbacks)
    assert_readable(charts_on(page, "#fleet-charts")["chart-fallbacks"])


def _over_budget(charts: dict[str, Any]) -> bool:
    today = charts.get("chart-spend-today", {"lines": []})
    jobs = charts.get("chart-jobs", {"lines": []})
    spend = points(today).get("home-1", 0)
    return bool(spend >= 2 and all(n >= 2 for n in points(jobs).values()) and jobs["lines"])


@pytest.mark.timeout(TEST_TIMEOUT_S)
@pytest.mark.parametrize("scenario", ["budget"], indirect=True)
def test_the_runtime_page_during_the_budget_scenario_charts_queue_and_spend(
    page: Page, scenario: Demo
) -> None:
    log_in(page, scenario, "/console/runtimes/home-1")
    badge = page.locator("#live .badge", has_text="over budget: skipped in the walk")
    expect(badge).to_be_visible(timeout=WAIT_MS)
    charts = wait_for_charts(page, "#runtime-charts", _over_budget, "home-1's spend")
    shot(page, "12-runtime-budget")
    for chart in charts.values():
        assert_readable(chart)
    assert {"queued", "in flight"} == set(points(charts["chart-jobs"]))
    per_day = charts["spend-chart"]
    assert 14 == len(per_day["bars"])
    assert per_day["bars"][-1] > 0, "today's bar is empty"
    assert any("daily budget" in item for item in per_day["legend"])
