"""The Kubernetes manifests (deploy/k8s): each validates against the Kubernetes schemas, and
they agree with each other and with gpugate's config (issue #20)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from gpugate.config import GatewayConfig, config_from_document

K8S = Path(__file__).resolve().parents[2] / "deploy" / "k8s"
SERVICE_MONITOR_SCHEMA = Path(__file__).parent / "schemas" / "servicemonitor-v1-subset.json"
KUBERNETES_VERSIONS = ("1.30.0", "1.37.0")  # the oldest supported upstream release, the newest
EXIT_MARGIN_S = 5  # after the grace: hand back the claims, close the store, exit


def manifest(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((K8S / name).read_text())
    return loaded


def kustomized() -> list[str]:
    resources: list[str] = manifest("kustomization.yaml")["resources"]
    return resources


def core_manifests() -> list[str]:
    return [name for name in kustomized() if manifest(name)["kind"] != "ServiceMonitor"]


def gateway_config() -> GatewayConfig:
    return config_from_document(yaml.safe_load(manifest("configmap.yaml")["data"]["gateway.yaml"]))


def gateway_container() -> dict[str, Any]:
    (container,) = manifest("deployment.yaml")["spec"]["template"]["spec"]["containers"]
    return container


def test_the_kustomization_lists_every_manifest_of_the_folder() -> None:
    on_disk = sorted(p.name for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml")
    assert on_disk == sorted(kustomized())


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("name", core_manifests())
def test_each_manifest_validates_strictly_against_the_kubernetes_schema(
    name: str, version: str
) -> None:
    kubernetes_validate.validate(manifest(name), version, strict=True)


def test_the_service_monitor_validates_against_its_documented_schema() -> None:
    schema = json.loads(SERVICE_MONITOR_SCHEMA.read_text())
    jsonschema.validate(manifest("servicemonitor.yaml"), schema)


def test_a_misspelt_key_fails_the_validation() -> None:
    """The check can fail: strict validation refuses a key the schema does not know."""
    broken = manifest("deployment.yaml")
    broken["spec"]["template"]["spec"]["terminationGracePeriod"] = 40
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSIONS[0], strict=True)


def test_the_config_map_holds_a_valid_gateway_config_listening_on_the_container_port() -> None:
    config = gateway_config()
    (port,) = gateway_container()["ports"]

    assert ("0.0.0.0", port["containerPort"]) == (config.host, config.port)
    assert config.store.startswith("postgresql://")  # replicas share one PostgreSQL


def test_the_termination_grace_covers_the_drain_delay_and_the_shutdown_grace() -> None:
    server = gateway_config().server
    pod = manifest("deployment.yaml")["spec"]["template"]["spec"]

    expected = server.drain_delay_s + server.shutdown_grace_s + EXIT_MARGIN_S
    assert expected == pod["terminationGracePeriodSeconds"]
    assert server.drain_delay_s > 0  # load balancers get time to notice


def test_readiness_asks_readyz_and_liveness_asks_healthz() -> None:
    container = gateway_container()
    probes = {
        kind: container[kind]["httpGet"]["path"]
        for kind in ("readinessProbe", "livenessProbe", "startupProbe")
    }
    assert {
        "readinessProbe": "/readyz",
        "livenessProbe": "/healthz",
        "startupProbe": "/healthz",
    } == probes


def test_the_secret_holds_every_environment_variable_the_config_names() -> None:
    config = gateway_config()
    named = {config.admin_token_env}
    named |= {u.api_key_env for u in config.upstreams if u.api_key_env}
    named |= {r.push.secret_env for r in config.runtimes if r.kind == "push"}  # type: ignore[union-attr]
    secret = set(manifest("secret.yaml")["stringData"])

    assert named | {"PGPASSWORD"} == secret
    assert {"secretRef": {"name": "gpugate-secrets"}} in gateway_container()["envFrom"]


def test_the_service_the_budget_and_the_monitor_select_the_gateway_pods() -> None:
    pods = manifest("deployment.yaml")["spec"]["template"]["metadata"]["labels"]
    selectors = {
        "service": manifest("service.yaml")["spec"]["selector"],
        "budget": manifest("poddisruptionbudget.yaml")["spec"]["selector"]["matchLabels"],
        "monitor": manifest("servicemonitor.yaml")["spec"]["selector"]["matchLabels"],
        "deployment": manifest("deployment.yaml")["spec"]["selector"]["matchLabels"],
    }
    assert dict.fromkeys(selectors, pods) == selectors
    assert manifest("service.yaml")["metadata"]["labels"] == pods  # the monitor finds it


def test_the_pods_run_as_non_root_on_a_read_only_root_with_requests_sized() -> None:
    for name in ("deployment.yaml", "worker-daemonset.yaml"):
        pod = manifest(name)["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        assert {"cpu", "memory"} <= set(container["resources"]["requests"])
        assert "memory" in container["resources"]["limits"]


def test_each_gpu_node_has_its_exporter_and_its_push_runtime_named_after_the_node() -> None:
    config = gateway_config()
    assert config.gpu_health is not None
    nodes = {exporter.host for exporter in config.gpu_health.exporters}
    push = {r.id: r for r in config.runtimes if r.kind == "push"}
    worker = manifest("worker-daemonset.yaml")["spec"]["template"]["spec"]["containers"][0]

    assert nodes == set(push)
    assert "--runtime=$(NODE_NAME)" in worker["args"]
    assert {f"http://{node}:9100/calls" for node in nodes} == {
        str(r.push.url)
        for r in push.values()  # type: ignore[attr-defined]
    }
    secret_envs = {r.push.secret_env for r in push.values()}  # type: ignore[attr-defined]
    assert {f"--secret-env={env}" for env in secret_envs} <= set(worker["args"])
