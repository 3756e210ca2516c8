"""The shipped dashboard and alert rules (deploy/monitoring/, issue #19 done-when 4): every query
and every expression parses as PromQL and names only metric families — and, where the gateway
has samples of them, only label names — that a running gateway exposes at ``/metrics``."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import promql_parser
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from gpugate.fleet import FakeExporter, ModelServer
from harness import eventually, make_config, serving, upstream

MONITORING = Path(__file__).resolve().parents[2] / "deploy" / "monitoring"
#: Grafana's own variables, replaced by what Grafana itself substitutes before Prometheus sees it.
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$__interval": "1m", "$model": ".*"}
#: Series Prometheus itself makes (a rule may use them; no gateway exposes them).
PROMETHEUS_OWN = {"up"}
#: The sample names each family type exposes.
SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "gauge": ("",),
    "info": ("_info",),
    "summary": ("", "_sum", "_count", "_created"),
    "unknown": ("",),
}


def rule_expressions() -> Iterator[tuple[str, str]]:
    document = yaml.safe_load((MONITORING / "alerts.yaml").read_text(encoding="utf-8"))
    for group in document["groups"]:
        for rule in group["rules"]:
            yield rule.get("alert") or rule["record"], rule["expr"]


def dashboard_expressions() -> Iterator[tuple[str, str]]:
    dashboard = json.loads((MONITORING / "grafana-dashboard.json").read_text(encoding="utf-8"))
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            for variable, value in GRAFANA_VARIABLES.items():
                expr = expr.replace(variable, value)
            yield panel["title"], expr
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            found = re.fullmatch(r"label_values\((\w+), (\w+)\)", variable["definition"])
            assert found, variable["definition"]
            yield f"variable {variable['name']}", f"count by ({found[2]}) ({found[1]})"


def selectors(expr: str) -> list[tuple[str, set[str]]]:
    """(metric name, label names it matches on or groups by) for each selector in ``expr``."""
    found: list[tuple[str, set[str]]] = []
    grouping: set[str] = set()

    def visit(node: object) -> None:
        if isinstance(node, promql_parser.AggregateExpr) and node.modifier is not None:
            grouping.update(node.modifier.labels)
        if isinstance(node, promql_parser.VectorSelector):
            names = {m.name for m in node.matchers.matchers}
            found.append((node.name, names))

    promql_parser.walk(promql_parser.parse(expr), visit)
    return [(name, labels | (grouping - {"le"})) for name, labels in found]


@pytest.fixture(scope="module")
def exposed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, set[str] | None]:
    """Sample name -> label names seen (None: a family with no samples yet) at a gateway that
    served a chat request, ran a job and polled a GPU exporter."""
    return asyncio.run(_scrape(tmp_path_factory.mktemp("monitoring") / "gpugate.db"))


async def _scrape(db: Path) -> dict[str, set[str] | None]:
    dsn = f"sqlite:///{db}"
    async with FakeExporter(1) as exporter, ModelServer(["m1"], name="a") as server:
        config = make_config(
            dsn,
            [upstream("u1", [server.url], ["m1"], gpu_ids=[0])],
            gpu_health={"dcgm_url": exporter.metrics_url, "poll_s": 0.2},
        )
        async with serving(config) as gw, aiohttp.ClientSession() as http:
            body = {"model": "m1", "messages": [{"role": "user", "content": "hi"}]}
            async with http.post(gw.v1 + "/chat/completions", json=body) as resp:
                assert 200 == resp.status
            async with http.post(gw.v1 + "/jobs", json={"model": "m1", "input": body}) as resp:
                assert 202 == resp.status
            await eventually(lambda: exporter.scrapes >= 2, what="two GPU polls")
            async with http.get(gw.url + "/metrics") as resp:
                text = await resp.text()
    seen: dict[str, set[str] | None] = {}
    for family in text_string_to_metric_families(text):
        for suffix in SUFFIXES[family.type]:
            seen.setdefault(family.name + suffix, None)
        for sample in family.samples:
            labels = seen.get(sample.name) or set()
            seen[sample.name] = labels | (set(sample.labels) - {"le", "quantile"})
    return seen


EXPRESSIONS = [*rule_expressions(), *dashboard_expressions()]


@pytest.mark.parametrize(("where", "expr"), EXPRESSIONS, ids=[w for w, _ in EXPRESSIONS])
def test_every_shipped_query_names_metrics_and_labels_the_gateway_exposes(
    where: str, expr: str, exposed: dict[str, set[str] | None]
) -> None:
    used = selectors(expr)
    assert used, f"{where}: names no metric"
    for name, labels in used:
        if name in PROMETHEUS_OWN:
            continue
        assert name in exposed, f"{where}: {name} is not exposed at /metrics"
        known = exposed[name]
        if known is not None:
            assert labels <= known, f"{where}: {name} has no label {sorted(labels - known)}"


def test_the_alert_rules_cover_the_signals_the_operations_guide_names() -> None:
    alerts = {name for name, _ in rule_expressions()}
    for signal in (
        "GpugateGpuFaulted",
        "GpugateGpuExporterStale",
        "GpugateNoHealthyUpstream",
        "GpugateJobQueueGrowing",
        "GpugateJobsLost",
        "GpugateJobsRescuedRising",
        "GpugateStuckCalls",
        "GpugateStopConditionFired",
        "GpugateRuntimeSoftCap",
    ):
        assert signal in alerts


def test_a_query_naming_a_metric_the_gateway_lacks_is_caught(
    exposed: dict[str, set[str] | None],
) -> None:
    # the check above can fail: a misspelt family and a label no family has are both found
    ((name, _),) = selectors("rate(gateway_request_total[5m])")
    assert name not in exposed
    ((name, labels),) = selectors('sum by (tenant) (rate(gateway_requests_total{code="x"}[5m]))')
    assert not labels <= (exposed[name] or set())
    # and the GPU and job families had samples, so their labels were checked too
    assert {"host", "gpu", "instance"} <= (exposed["gateway_gpu_faulted"] or set())
    assert exposed["gateway_requests_total"]
