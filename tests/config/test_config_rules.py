"""The cross-field rules: each one alone, with the key path it names."""

from __future__ import annotations

import textwrap

import pytest
from config_factories import (
    document,
    modal_runtime,
    problems_of_document,
    problems_of_yaml,
    push_runtime,
    upstream,
)

from gpugate.config import GatewayConfig


def test_a_second_upstream_with_the_same_id_is_reported_at_its_id() -> None:
    doc = document(upstreams=[upstream("qwen"), upstream("tei"), upstream("qwen")])

    assert [
        "upstreams[2].id: upstream id 'qwen' is defined twice (first at upstreams[0].id)"
    ] == problems_of_document(doc)


def test_a_second_runtime_with_the_same_id_is_reported_at_its_id() -> None:
    doc = document(runtimes=[push_runtime("home-1"), push_runtime("home-1")])

    assert [
        "runtimes[1].id: runtime id 'home-1' is defined twice (first at runtimes[0].id)"
    ] == problems_of_document(doc)


def test_a_chain_naming_an_undefined_runtime_lists_the_defined_ones() -> None:
    doc = document(runtimes=[{"id": "local", "kind": "upstream"}], fallback_chain=["local", "gone"])

    assert [
        "fallback_chain[1]: names runtime 'gone', which is not defined (defined: local)"
    ] == problems_of_document(doc)


def test_a_chain_naming_a_runtime_twice_is_reported_at_the_repeat() -> None:
    doc = document(fallback_chain=["local", "local"])

    assert [
        "fallback_chain[1]: names runtime 'local' again (first at fallback_chain[0])"
    ] == problems_of_document(doc)


def test_a_default_runtime_that_is_not_defined_is_a_problem() -> None:
    doc = document(default_runtime="home-1")

    assert [
        "default_runtime: names runtime 'home-1', which is not defined (defined: local)"
    ] == problems_of_document(doc)


def test_a_default_taken_from_a_bad_chain_is_reported_once_at_the_chain() -> None:
    assert [
        "fallback_chain[0]: names runtime 'gone', which is not defined (defined: local)"
    ] == problems_of_document(document(fallback_chain=["gone"]))


def test_an_empty_chain_is_a_problem() -> None:
    assert ["fallback_chain: expected at least 1 item(s), got 0"] == problems_of_document(
        document(fallback_chain=[])
    )


def test_the_chain_defaults_to_every_runtime_in_order_and_the_default_to_its_head() -> None:
    doc = document(runtimes=[push_runtime("home-1"), {"id": "local", "kind": "upstream"}])

    config = GatewayConfig.model_validate(doc)

    assert (["home-1", "local"], "home-1") == (config.fallback_chain, config.default_runtime)


def test_an_upstream_runtime_listing_a_model_no_upstream_serves_is_a_problem() -> None:
    doc = document(runtimes=[{"id": "local", "kind": "upstream", "models": ["qwen", "llama"]}])

    assert [
        "runtimes[0].models[1]: model 'llama' is not served by any upstream (served: qwen)"
    ] == problems_of_document(doc)


@pytest.mark.parametrize("factory", [push_runtime, modal_runtime])
@pytest.mark.parametrize("models", [None, []])
def test_a_push_or_modal_runtime_without_models_is_a_problem(
    factory: object, models: list[str] | None
) -> None:
    runtime = factory()  # type: ignore[operator]
    if models is None:
        del runtime["models"]
    else:
        runtime["models"] = models
    kind = runtime["kind"]

    assert [
        (
            f"runtimes[0].models: a {kind} runtime needs at least one model:"
            " it serves only those listed"
        )
    ] == problems_of_document(document(runtimes=[runtime]))


def test_a_push_runtime_may_serve_a_model_no_upstream_serves() -> None:
    assert [] == problems_of_document(document(runtimes=[push_runtime(models=("llama",))]))


def test_an_upstream_needs_exactly_one_of_url_and_urls() -> None:
    both = upstream("both", urls=["http://127.0.0.1:8002"])
    neither = {"id": "neither", "models": ["qwen"]}

    assert [
        "upstreams[0].urls: give url or urls, not both",
        "upstreams[1].url: required key is missing: give url, or urls for several",
    ] == problems_of_document(document(upstreams=[both, neither]))


def test_a_model_listed_twice_by_one_upstream_is_a_problem() -> None:
    assert [
        "upstreams[0].models[1]: 'qwen' is listed twice (first at upstreams[0].models[0])"
    ] == problems_of_document(document(upstreams=[upstream(models=("qwen", "qwen"))]))


def test_dcgm_url_and_exporters_together_are_a_problem() -> None:
    gpu_health = {
        "dcgm_url": "http://127.0.0.1:9400/metrics",
        "exporters": [{"host": "node-a", "url": "http://127.0.0.1:9401/metrics"}],
    }

    assert [
        "gpu_health.exporters: give dcgm_url (one exporter) or exporters (several hosts), not both"
    ] == problems_of_document(document(gpu_health=gpu_health))


def test_two_exporters_for_one_host_are_a_problem() -> None:
    exporter = {"host": "node-a", "url": "http://127.0.0.1:9401/metrics"}

    assert [
        (
            "gpu_health.exporters[1].host: host 'node-a' has an exporter already"
            " (at gpu_health.exporters[0].host)"
        )
    ] == problems_of_document(document(gpu_health={"exporters": [exporter, exporter]}))


def test_rules_are_checked_even_where_the_schema_fails_elsewhere() -> None:
    doc = document(
        upstreams=[upstream(max_inflight=0), upstream()],
        runtimes=[push_runtime(max_concurrency="two")],
        fallback_chain=["home-1", "cloud"],
    )

    assert [
        "upstreams[0].max_inflight: expected a number of at least 1, got 0",
        "upstreams[1].id: upstream id 'qwen' is defined twice (first at upstreams[0].id)",
        "runtimes[0].max_concurrency: expected an integer, got 'two'",
        "fallback_chain[1]: names runtime 'cloud', which is not defined (defined: home-1)",
    ] == problems_of_document(doc)


def test_rule_problems_carry_the_line_of_their_key() -> None:
    text = textwrap.dedent("""\
        upstreams:
          - id: qwen
            url: http://127.0.0.1:8001
            models: [qwen]
        runtimes:
          - id: local
            kind: upstream
          - id: local
            kind: upstream
        """)

    assert [
        "runtimes[1].id: runtime id 'local' is defined twice (first at runtimes[0].id) (line 8)"
    ] == problems_of_yaml(text)


def test_a_config_built_in_code_is_held_to_the_same_rules() -> None:
    with pytest.raises(ValueError, match="names runtime 'cloud', which is not defined"):
        GatewayConfig.model_validate(document(fallback_chain=["cloud"], default_runtime="local"))
