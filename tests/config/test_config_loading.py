"""Reading a config file: the examples, the defaults, and every way a file can be wrong."""

from __future__ import annotations

import textwrap
from typing import TYPE_CHECKING

import pytest
import yaml
from config_factories import EXAMPLES, problems_of_yaml

from gpugate.config import (
    BudgetConfig,
    GatewayConfig,
    JobsConfig,
    ServerConfig,
    StopConditions,
    UpstreamConfig,
    UpstreamRuntimeConfig,
    config_from_document,
    fallback_warnings,
    load_config,
    parse_config,
)
from gpugate.errors import ConfigError, ConfigProblem

if TYPE_CHECKING:
    from pathlib import Path


def problems_of_file(path: Path) -> list[ConfigProblem]:
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    return caught.value.problems


def test_the_design_example_is_valid_and_says_only_what_the_defaults_say() -> None:
    """DESIGN §2: "the values in the example above are the defaults (stop conditions included)"."""
    only_what_differs = {
        "gpu_health": {"dcgm_url": "http://127.0.0.1:9400/metrics"},
        "upstreams": [
            {
                "id": "qwen-35b",
                "url": "http://127.0.0.1:8001",
                "models": ["qwen-35b"],
                "gpu_ids": [0],
            },
            {
                "id": "tei-embeddings",
                "url": "http://127.0.0.1:8002",
                "models": ["bge-m3"],
                "gpu_ids": [1],
            },
        ],
        "runtimes": [
            {"id": "local", "kind": "upstream"},
            {
                "id": "home-1",
                "kind": "push",
                "models": ["qwen-35b"],
                "push": {"url": "http://127.0.0.1:9100/calls", "secret_env": "HOME1_WORKER_SECRET"},
            },
            {
                "id": "modal-beta",
                "kind": "modal",
                "models": ["qwen-35b"],
                "modal": {"app": "worker", "function": "generate", "environment": "beta"},
            },
        ],
    }

    example = load_config(EXAMPLES / "gateway.yaml")

    assert config_from_document(only_what_differs) == example


def test_the_design_example_reads_as_written() -> None:
    config = load_config(EXAMPLES / "gateway.yaml")

    assert ("127.0.0.1", 8080) == (config.host, config.port)
    assert ["qwen-35b", "tei-embeddings"] == [upstream.id for upstream in config.upstreams]
    assert ["local", "home-1", "modal-beta"] == config.fallback_chain
    assert "local" == config.default_runtime
    assert (
        BudgetConfig(daily_cents=1000, cents_per_second=0.05) == config.runtime("modal-beta").budget
    )
    assert config.gpu_health is not None
    assert not config.gpu_health.dormant


# DESIGN §2a's keys as it prints them; the upstream keys go on the example's first upstream.
WAVE2_KEYS = """\
config_source: file
auth: {mode: open, bootstrap_keys_env: GPUGATE_BOOTSTRAP_KEYS}
models:
  - name: qwen-35b
    fallbacks: [qwen-7b]
    context_fallbacks: [qwen-35b-long]
    routing: {policy: prefix_affinity}
retention: {jobs_s: 2592000, audit_s: 7776000, batches_s: 2592000}
tls: {cert_file: /etc/gpugate/tls.crt, key_file: /etc/gpugate/tls.key, client_ca_file: null}
admin_listen: null
"""
WAVE2_UPSTREAM_KEYS = {
    "retry": {"attempts": 3, "backoff_s": 0.5, "max_backoff_s": 4, "retry_after_max_s": 10},
    "first_token_timeout_s": 30,
    "stream_idle_timeout_s": 30,
    "engine": {"kind": "vllm", "metrics_path": "/metrics", "poll_s": 2},
    "raw": {"methods": ["GET", "POST"], "path_prefixes": ["/v1/"], "send_key": False},
}


def test_the_design_example_with_every_wave2_key_loads_and_warns_of_its_unserved_fallbacks(
    tmp_path: Path,
) -> None:
    """§2a's fallbacks name models the §2 example's upstreams do not serve: warned, not refused."""
    document = yaml.safe_load((EXAMPLES / "gateway.yaml").read_text())
    document.update(yaml.safe_load(WAVE2_KEYS))
    document["upstreams"][0].update(WAVE2_UPSTREAM_KEYS)
    path = tmp_path / "wave2.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))

    config = load_config(path)

    assert ("prefix_affinity", "vllm") == (
        config.models[0].routing.policy,
        config.upstreams[0].engine.kind,
    )
    assert [
        ("models[0].fallbacks[0]", True, True),
        ("models[0].context_fallbacks[0]", True, True),
    ] == [
        (p.path, "no upstream serves model" in p.message, p.line is not None)
        for p in fallback_warnings(config)
    ]


def test_a_file_with_one_upstream_gets_every_default() -> None:
    config = parse_config(
        textwrap.dedent("""\
        upstreams:
          - id: qwen
            url: http://127.0.0.1:8001
            models: [qwen]
        """)
    )

    assert "127.0.0.1:8080" == config.listen
    assert "sqlite:///./gpugate.db" == config.store
    assert "GPUGATE_ADMIN_TOKEN" == config.admin_token_env
    assert config.gpu_health is None
    assert [UpstreamRuntimeConfig(id="local", kind="upstream")] == config.runtimes
    assert ["local"] == config.fallback_chain
    assert "local" == config.default_runtime
    assert StopConditions(max_submits_per_job=3, max_stuck=3, disable_on_auth_error=True) == (
        config.stop_conditions
    )
    assert (
        JobsConfig(
            sweep_s=60,
            reap_s=15,
            quiet_s=60,
            max_rescues=3,
            dispatcher_lease_s=600,
            max_attempts_per_runtime=2,
        )
        == config.jobs
    )
    assert (
        ServerConfig(
            shutdown_grace_s=30,
            max_body_bytes=10485760,
            idempotency_ttl_s=86400,
            log_format="text",
        )
        == config.server
    )
    upstream = config.upstream("qwen")
    assert (64, 30.0, 300.0, False, 1024, 5.0, 45.0, "/health", None, []) == (
        upstream.max_inflight,
        upstream.queue_timeout_s,
        upstream.timeout_s,
        upstream.external,
        upstream.max_queue,
        upstream.connect_timeout_s,
        upstream.first_byte_timeout_s,
        upstream.health_path,
        upstream.api_key_env,
        upstream.gpu_ids,
    )


def test_a_wrong_type_an_unknown_key_and_a_missing_runtime_are_reported_together() -> None:
    """examples/invalid.yaml: exactly these three problems, each with its key path and line."""
    allowed = ", ".join(UpstreamConfig.model_fields)  # every key, in declaration order
    assert allowed.startswith("id, url, urls, models, gpu_ids, max_inflight")
    expected = [
        "upstreams[0].max_inflight: expected an integer, got 'lots' (line 11)",
        f"upstreams[0].gpu_id: unknown key (allowed: {allowed}) (line 12)",
        (
            "fallback_chain[1]: names runtime 'nope', which is not defined"
            " (defined: local, home-1) (line 22)"
        ),
    ]

    with pytest.raises(ConfigError) as caught:
        load_config(EXAMPLES / "invalid.yaml")

    assert expected == [str(problem) for problem in caught.value.problems]
    assert str(EXAMPLES / "invalid.yaml") == caught.value.source


def test_a_missing_key_is_reported_at_the_line_of_its_parent_mapping() -> None:
    text = textwrap.dedent("""\
        upstreams:
          - id: qwen
            url: http://127.0.0.1:8001
            models: [qwen]
        runtimes:
          - id: home-1
            kind: push
            models: [qwen]
            push:
              url: http://127.0.0.1:9100/calls
        """)

    assert ["runtimes[0].push.secret_env: required key is missing (line 9)"] == problems_of_yaml(
        text
    )


def test_a_key_given_twice_in_one_mapping_is_a_problem_at_the_second() -> None:
    text = textwrap.dedent("""\
        upstreams:
          - id: qwen
            url: http://127.0.0.1:8001
            models: [qwen]
            url: http://127.0.0.1:8002
        """)

    assert [
        "upstreams[0].url: duplicate key 'url' (first at line 3); a key may appear once (line 5)"
    ] == problems_of_yaml(text)


def test_malformed_yaml_is_one_problem_with_its_line() -> None:
    text = textwrap.dedent("""\
        listen: 127.0.0.1:8080
        upstreams:
          - id: qwen
            models: [qwen
          url: http://127.0.0.1:8001
        """)

    problems = problems_of_yaml(text)

    assert 1 == len(problems)
    assert problems[0].startswith("(document): invalid YAML: ")
    assert problems[0].endswith("(line 5)")


def test_a_yaml_tag_that_builds_objects_is_refused_as_invalid_yaml() -> None:
    problems = problems_of_yaml("upstreams: !!python/object:os.system echo\n")

    assert 1 == len(problems)
    assert problems[0].startswith("(document): invalid YAML: could not determine a constructor")


def test_a_missing_file_is_one_problem_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.yaml"

    assert [ConfigProblem("", f"cannot read {path}: no such file")] == problems_of_file(path)


def test_a_directory_is_not_a_config_file(tmp_path: Path) -> None:
    assert [
        ConfigProblem("", f"cannot read {tmp_path}: it is a directory, not a file")
    ] == problems_of_file(tmp_path)


def test_a_file_that_is_not_utf8_is_one_problem(tmp_path: Path) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes("listen: caf\xe9\n".encode("latin-1"))

    [problem] = problems_of_file(path)

    assert problem.message.startswith(f"cannot read {path}: not UTF-8 text")


@pytest.mark.parametrize("text", ["", "\n", "# only a comment\n"])
def test_an_empty_file_is_one_problem(text: str) -> None:
    assert [
        "(document): the file is empty: expected a mapping with at least upstreams"
    ] == problems_of_yaml(text)


def test_a_file_that_is_not_a_mapping_is_one_problem() -> None:
    assert [
        "(document): expected a mapping of configuration keys, got a list (line 1)"
    ] == problems_of_yaml("- upstreams\n")


def test_a_file_without_upstreams_says_they_are_required() -> None:
    assert ["upstreams: required key is missing (line 1)"] == problems_of_yaml(
        "listen: 127.0.0.1:9\n"
    )


def test_the_error_names_its_source_and_every_problem() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config("listen: 5\n", source="gw.yaml")

    assert "gw.yaml" == caught.value.source
    assert (
        "gw.yaml: listen: expected a string, got 5 (line 1);"
        " upstreams: required key is missing (line 1)"
    ) == str(caught.value)


def test_a_config_read_from_a_file_equals_the_same_config_from_a_document() -> None:
    """Where a config came from (its line map) is not part of its value."""
    text = "upstreams: [{id: qwen, url: 'http://127.0.0.1:8001', models: [qwen]}]\n"
    doc = {"upstreams": [{"id": "qwen", "url": "http://127.0.0.1:8001", "models": ["qwen"]}]}

    from_file, from_document = parse_config(text), config_from_document(doc)

    assert from_document == from_file
    assert {} == dict(from_document.source_map.lines)
    assert 1 == from_file.source_map.line(("upstreams", 0, "models"))
    assert isinstance(from_file, GatewayConfig)
