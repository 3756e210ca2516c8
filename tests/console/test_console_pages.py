"""The console's pages and actions read and change the same state as the admin API."""

from __future__ import annotations

import asyncio
import html
import re

import yaml
from console_rig import Console, console_of

from gpugate.core.gpu.report import NOTHING_TO_JUDGE
from gpugate.fleet import FakeExporter
from gpugate.services.jobs import JobRequest
from gpugate.store import AuditEvent
from gpugate.web.console import views


async def test_the_fleet_page_shows_upstreams_gpus_and_runtimes(console: Console) -> None:
    await console.login()
    status, text = await console.page()
    assert 200 == status
    for needle in ('data-upstream="a"', 'data-upstream="b"', 'data-runtime="local"', "GPUs"):
        assert needle in text
    assert text.count("data-gpu=") == 2


async def test_draining_a_runtime_changes_its_state_and_audits_the_console_actor(
    console: Console,
) -> None:
    await console.login(name="alice")
    status, location, _ = await console.post(
        "/runtimes/local/drain", {"reason": "maintenance", "next": "/console/runtimes/local"}
    )
    assert 303 == status
    assert location.startswith("/console/runtimes/local?notice=")
    _, page = await console.page("/runtimes/local")
    assert '<span class="badge drained">drained</span>' in page
    assert "maintenance" in page
    events = await console.gw.gateway.store.list_audit(subject="runtime:local")
    assert [("console:alice", "runtime.drained")] == [(e.actor, e.action) for e in events]


async def test_an_unknown_runtime_action_comes_back_as_an_error_notice(console: Console) -> None:
    await console.login()
    _, location, _ = await console.post("/runtimes/nope/disable", {"next": "/console/runtimes"})
    assert location.startswith("/console/runtimes?error=UNKNOWN_RUNTIME")


async def test_clearing_a_gpu_fault_returns_its_upstream_to_rotation(console: Console) -> None:
    monitor = console.gw.gateway.monitor
    assert monitor is not None
    await monitor.tick()
    console.exporter.set_gpu(0, xid=79)
    await monitor.tick()
    assert monitor.guard("a") is not None
    await console.login()
    _, page = await console.page()
    assert "Clear fault" in page
    assert "<b>1</b> GPU faulted" in page  # one GPU, not "1 GPUs"
    assert "<b>0</b> GPUs stale" in page
    status, _, _ = await console.post("/gpus/fleet-node/0/clear", {"next": "/console"})
    assert 303 == status
    assert monitor.guard("a") is None
    events = await console.gw.gateway.store.list_audit(action="gpu.cleared")
    assert ["console:alice"] == [e.actor for e in events]


async def test_a_gpu_whose_scrape_holds_no_series_a_verdict_reads_shows_unknown_not_ok(
    sqlite_dsn: str,
) -> None:
    """Util and temperature only, and no temperature threshold: neither ok nor faulted."""
    async with (
        FakeExporter(gpus=2, counters=(), emit_xid=False) as exporter,
        console_of(sqlite_dsn, exporter, max_temp_c=None) as console,
    ):
        await console.login()
        _, page = await console.page()

    rows = re.findall(r'<tr data-gpu="[^"]+" class="(\w+)">.*?</tr>', page, re.DOTALL)
    assert ["unknown", "unknown"] == rows
    assert 2 == page.count('<span class="badge muted">unknown</span>')
    assert 2 == page.count(NOTHING_TO_JUDGE)
    assert "Clear fault" not in page


async def test_an_invalid_import_preview_lists_every_problem_and_changes_nothing(
    console: Console,
) -> None:
    await console.login()
    document = (
        "upstreams:\n  - id: a\n    models: []\n    url: not-a-url\nfallback_chain: [nowhere]\n"
    )
    status, _, page = await console.post("/config/preview", {"document": document})
    assert 422 == status
    problems = html.unescape(page)
    for path in ("upstreams[0].models", "upstreams[0].url", "fallback_chain"):
        assert f"<code>{path}" in problems
    assert "nothing would change" in page
    assert 1 == console.gw.gateway.config_version


async def test_a_valid_preview_shows_the_diff_and_import_stores_a_new_version(
    console: Console,
) -> None:
    await console.login()
    export = await console.gw.gateway.config_versions.export()
    document = yaml.safe_load(yaml.safe_dump(export.document))
    document["upstreams"][0]["max_inflight"] = 7
    text = yaml.safe_dump(document)
    status, _, page = await console.post("/config/preview", {"document": text})
    assert 200 == status
    assert '<span class="add">+  max_inflight: 7</span>' in page
    assert 1 == console.gw.gateway.config_version
    status, location, _ = await console.post("/config/import", {"document": text})
    assert (303, 2) == (status, console.gw.gateway.config_version)
    assert "Imported+as+version+2" in location


async def test_rollback_from_the_console_restores_the_earlier_document(console: Console) -> None:
    await console.login()
    versions = console.gw.gateway.config_versions
    assert versions is not None
    first = (await versions.export()).document
    changed = yaml.safe_load(yaml.safe_dump(first))
    changed["upstreams"][1]["max_inflight"] = 3
    await console.post("/config/import", {"document": yaml.safe_dump(changed)})
    status, _, _ = await console.post("/config/rollback/1", {"next": "/console/config"})
    assert (303, 3) == (status, console.gw.gateway.config_version)
    assert first == (await versions.export()).document


async def test_the_export_download_is_the_current_version_as_yaml(console: Console) -> None:
    await console.login()
    async with console.http.get(console.url + "/config/export") as resp:
        text = await resp.text()
        disposition = resp.headers["Content-Disposition"]
    export = await console.gw.gateway.config_versions.export()
    assert export.document == yaml.safe_load(text)
    assert 'attachment; filename="gateway.v1.yaml"' == disposition


async def test_the_jobs_page_filters_and_a_job_page_shows_its_timeline(console: Console) -> None:
    jobs = console.gw.gateway.jobs
    assert jobs is not None
    job, _ = await jobs.create(
        JobRequest("m", {"messages": [{"role": "user", "content": "hi"}]}), idempotency_key=None
    )
    async with asyncio.timeout(10):
        while (await jobs.get(job.slug)).state != "completed":
            await asyncio.sleep(0.01)
    await console.login()
    _, listing = await console.page("/jobs?state=completed")
    _, none = await console.page("/jobs?state=failed")
    _, page = await console.page(f"/jobs/{job.slug}")
    assert f'data-job="{job.slug}"' in listing
    assert f'data-job="{job.slug}"' not in none
    trail = ["queued", "dispatching", "submitted", "running", "completed"]
    timeline = [s for s in trail if f"<b>{s}</b>" in page]
    assert trail == timeline


async def test_the_audit_page_filters_by_action_and_reports_a_bad_since(console: Console) -> None:
    await console.login()
    await console.post("/runtimes/local/disable", {"reason": "x"})
    _, hits = await console.page("/audit?action=runtime.disabled")
    _, misses = await console.page("/audit?action=runtime.enabled")
    _, bad = await console.page("/audit?since=yesterday")
    assert "<td>runtime:local</td>" in hits
    assert "<td>runtime:local</td>" not in misses
    assert "since must be an ISO-8601 time" in bad


async def test_a_fragment_is_the_live_region_alone(console: Console) -> None:
    await console.login()
    _, fragment = await console.page("/runtimes?fragment=1")
    assert 'data-runtime="local"' in fragment
    assert "<html" not in fragment
    assert 'name="next" value="/console/runtimes"' in fragment


def test_the_spend_chart_draws_dollars_per_day_against_the_budget_and_twice_it() -> None:
    days = [{"day": f"2025-01-{d:02}", "cents": 0} for d in range(1, 15)]
    days[-2]["cents"], days[-1]["cents"] = 20, 80
    chart = views.spend_chart({"daily_cents": 100, "days": days})
    assert 14 == len(chart.bars)
    assert ["01-13: $0.20", "01-14: $0.80"] == [b["title"] for b in chart.bars[-2:]]
    assert ["daily budget $1.00", "over budget (2x) $2.00"] == [r["label"] for r in chart.rules]
    assert "$2.00" == chart.y_ticks[-1]["label"]  # the top: twice the budget


async def test_the_fleet_page_charts_the_requests_the_gateway_answered(console: Console) -> None:
    ring = console.gw.gateway.samples
    assert ring is not None
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    ring.tick()
    for _ in range(2):
        async with console.http.post(console.gw.url + "/v1/chat/completions", json=body) as resp:
            assert 200 == resp.status
        ring.tick()
    await console.login()
    _, page = await console.page()
    chart = page[
        page.index('id="chart-requests"') : page.index(
            "</figure>", page.index('id="chart-requests"')
        )
    ]
    path = re.search(r'<path class="line ok" data-series="200" d="([^"]+)"', chart)  # green
    assert path is not None, chart
    assert len(re.findall(r"[ML][\d.]+,[\d.]+", path.group(1))) >= 2
    assert '<li data-series="200">' in chart  # the legend
    for chart_id in (
        "chart-latency",
        "chart-ttfb",
        "chart-queue",
        "chart-gpu-util",
        "chart-gpu-temp",
    ):
        assert f'id="{chart_id}"' in page


async def test_a_runtime_page_charts_its_queue_and_spend_per_day(console: Console) -> None:
    ring = console.gw.gateway.samples
    assert ring is not None
    ring.tick()
    await console.login()
    _, page = await console.page("/runtimes/local")
    _, fragment = await console.page("/runtimes/local?fragment=1")
    for chart_id in ("chart-jobs", "spend-chart"):
        assert f'id="{chart_id}"' in page
        assert f'id="{chart_id}"' in fragment  # the live refresh redraws the charts
    assert '<li data-series="queued">' in page


def test_answered_requests_are_green_and_each_error_code_has_a_warm_colour_of_its_own() -> None:
    classes = views.code_classes(["503", "200", "NO_HEALTHY_UPSTREAM", "201", "ok"])
    assert "ok" == classes["200"] == classes["201"] == classes["ok"]
    errors = [classes["503"], classes["NO_HEALTHY_UPSTREAM"]]
    assert len(set(errors)) == 2
    assert not set(errors) & {"ok", "s0"}


async def test_a_recorded_detail_shows_its_floats_without_binary_noise(console: Console) -> None:
    cents = 0.1 + 0.2  # 0.30000000000000004
    event = AuditEvent("gateway", "runtime.soft_cap", "runtime:local", {"cents": [cents]})
    await console.gw.gateway.store.append_audit(event)
    await console.login()
    _, page = await console.page("/audit?action=runtime.soft_cap")
    assert '<small>{"cents": [0.3]}</small>' in page
    assert "0.30000000000000004" not in page
