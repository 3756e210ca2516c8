"""The gateway document: the part of the config that lives in the store as versions."""

from __future__ import annotations

import json

import pytest
from config_factories import EXAMPLES, config_of, push_runtime, upstream

from gpugate.config import GATEWAY_KEYS, config_from_document, load_config
from gpugate.errors import ConfigError


def test_the_gateway_document_holds_exactly_the_stored_keys() -> None:
    assert list(GATEWAY_KEYS) == list(load_config(EXAMPLES / "gateway.yaml").gateway_document())


def test_the_gateway_document_round_trips_through_json_and_the_process_keys() -> None:
    config = load_config(EXAMPLES / "gateway.yaml")
    stored = json.loads(json.dumps(config.gateway_document()))

    again = config_from_document({**config.process_document(), **stored})

    assert config == again
    assert config.gateway_document() == again.gateway_document()


def test_the_gateway_document_leaves_out_none_values_that_are_defaults() -> None:
    runtime = config_of().gateway_document()["runtimes"][0]

    assert {"id": "local", "kind": "upstream", "models": [], "enabled": True} == runtime


def test_a_none_that_overrides_a_default_survives_the_round_trip() -> None:
    """``budget: null`` on a push runtime (no budget) must not come back as the default budget."""
    config = config_of(runtimes=[push_runtime(budget=None)])

    again = config.with_gateway_document(config.gateway_document())

    assert again.runtime("home-1").budget is None


def test_a_new_gateway_document_replaces_the_old_whole_and_keeps_the_process_keys() -> None:
    config = load_config(EXAMPLES / "gateway.yaml")
    new = {"upstreams": [upstream("llama", models=("llama",))]}

    replaced = config.with_gateway_document(new)

    assert ["llama"] == replaced.served_models()
    assert ["local"] == replaced.fallback_chain
    assert config.process_document() == replaced.process_document()
    assert 1 == replaced.source_map.line(("listen",))


def test_an_invalid_gateway_document_is_refused_with_all_its_problems() -> None:
    config = load_config(EXAMPLES / "gateway.yaml")
    doc = {
        "upstreams": [upstream(max_inflight="many")],
        "runtimes": [push_runtime(models=())],
        "fallback_chain": ["home-1", "cloud"],
        "listen": "0.0.0.0:80",
    }

    with pytest.raises(ConfigError) as caught:
        config.with_gateway_document(doc)

    assert [
        "upstreams[0].max_inflight: expected an integer, got 'many'",
        "runtimes[0].models: a push runtime needs at least one model: it serves only those listed",
        "fallback_chain[1]: names runtime 'cloud', which is not defined (defined: home-1)",
        (
            "listen: not part of the gateway config (allowed: upstreams, runtimes, fallback_chain,"
            " default_runtime, stop_conditions, models)"
        ),
    ] == [str(problem) for problem in caught.value.problems]


def test_a_gateway_document_that_is_not_a_mapping_is_refused() -> None:
    with pytest.raises(ConfigError) as caught:
        config_of().with_gateway_document([])  # type: ignore[arg-type]

    assert ["(document): expected a mapping of gateway config keys, got a list"] == [
        str(problem) for problem in caught.value.problems
    ]
