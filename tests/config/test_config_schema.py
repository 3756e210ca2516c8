"""The blocks of the config: values, messages, lookups and the summary."""

from __future__ import annotations

from typing import Any

import pytest
from config_factories import (
    config_of,
    document,
    modal_runtime,
    problems_of_document,
    push_runtime,
    upstream,
)

from gpugate.config import (
    BudgetConfig,
    GatewayConfig,
    GpuHealthConfig,
    ModalConfig,
    ModalRuntimeConfig,
    PushRuntimeConfig,
    UpstreamConfig,
)


@pytest.mark.parametrize(
    ("listen", "host", "port"),
    [
        ("127.0.0.1:8080", "127.0.0.1", 8080),
        ("[::1]:9000", "::1", 9000),
        ("localhost:0", "localhost", 0),
    ],
)
def test_listen_splits_into_host_and_port(listen: str, host: str, port: int) -> None:
    config = config_of(listen=listen)

    assert (host, port) == (config.host, config.port)


@pytest.mark.parametrize("listen", ["127.0.0.1", "::1:8080", ":8080", "host:http", "host:70000"])
def test_a_listen_address_without_a_usable_port_is_a_problem(listen: str) -> None:
    assert [
        f"listen: expected host:port (e.g. 127.0.0.1:8080 or [::1]:8080), got {listen!r}"
    ] == problems_of_document(document(listen=listen))


@pytest.mark.parametrize("store", ["sqlite:///./x.db", "postgresql://u@h/db", "postgres://h/db"])
def test_the_store_is_sqlite_or_postgresql(store: str) -> None:
    assert store == config_of(store=store).store


def test_another_store_is_a_problem() -> None:
    assert [
        (
            "store: expected a URL starting with sqlite:///, postgresql:// or postgres://,"
            " got 'mysql://h/db'"
        )
    ] == problems_of_document(document(store="mysql://h/db"))


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("max_inflight", "lots", "expected an integer, got 'lots'"),
        ("max_inflight", "64", "expected an integer, got '64'"),
        ("max_inflight", True, "expected an integer, got true"),
        ("max_inflight", 0, "expected a number of at least 1, got 0"),
        ("timeout_s", 0, "expected a number greater than 0, got 0"),
        ("external", "yes", "expected true or false, got 'yes'"),
        ("models", "qwen", "expected a list, got 'qwen'"),
        ("models", [], "expected at least 1 item(s), got 0"),
        ("url", "ftp://h", "expected an http:// or https:// URL, got 'ftp://h'"),
        ("health_path", "health", "expected a path starting with '/', got 'health'"),
        (
            "id",
            "has space",
            (
                "expected an id of letters, digits, '.', '_' or '-' starting with a"
                " letter or digit, got 'has space'"
            ),
        ),
    ],
)
def test_an_upstream_value_of_the_wrong_kind_says_what_was_expected(
    key: str, value: Any, message: str
) -> None:
    assert [f"upstreams[0].{key}: {message}"] == problems_of_document(
        document(upstreams=[{**upstream(), key: value}])
    )


def test_an_unknown_runtime_kind_lists_the_kinds() -> None:
    assert [
        "runtimes[0].kind: expected one of 'upstream', 'push', 'modal', got 'lambda'"
    ] == problems_of_document(document(runtimes=[{"id": "x", "kind": "lambda"}]))


def test_a_runtime_without_a_kind_lists_the_kinds() -> None:
    assert [
        "runtimes[0].kind: required key is missing (one of 'upstream', 'push', 'modal')"
    ] == problems_of_document(document(runtimes=[{"id": "x"}]))


def test_an_unknown_key_in_a_runtime_lists_the_keys_of_its_kind() -> None:
    assert [
        (
            "runtimes[0].push: unknown key"
            " (allowed: id, kind, models, enabled, cache, max_concurrency, budget)"
        )
    ] == problems_of_document(
        document(runtimes=[{"id": "x", "kind": "upstream", "push": {"url": "http://h"}}])
    )


def test_a_missing_key_inside_a_runtime_block_names_the_block() -> None:
    runtime = modal_runtime(modal={"app": "worker"})

    assert ["runtimes[0].modal.function: required key is missing"] == problems_of_document(
        document(runtimes=[runtime])
    )


def test_push_and_modal_runtimes_have_their_own_defaults() -> None:
    config = config_of(runtimes=[push_runtime(), modal_runtime()])
    push, modal = config.runtimes
    assert isinstance(push, PushRuntimeConfig)
    assert isinstance(modal, ModalRuntimeConfig)

    assert 2 == push.max_concurrency
    assert BudgetConfig(daily_cents=1000, cents_per_second=0.02) == push.budget
    assert 2 == modal.max_concurrency
    assert BudgetConfig(daily_cents=1000, cents_per_second=0.05) == modal.budget
    assert 60.0 == modal.idle_exit_s
    assert (
        ModalConfig(
            app="worker",
            function="generate",
            environment=None,
            token_id_env="MODAL_TOKEN_ID",
            token_secret_env="MODAL_TOKEN_SECRET",
        )
        == modal.modal
    )


def test_gpu_health_defaults_and_dormancy() -> None:
    health = GpuHealthConfig()

    assert health.dormant
    assert (15.0, 60.0, 4, 95.0, True, False, 300.0, 90.0, 5.0, {}) == (
        health.poll_s,
        health.staleness_s,
        health.sustained_samples,
        health.shed_util_pct,
        health.couple_faults,
        health.shed_batch,
        health.fault_hold_s,
        health.max_temp_c,
        health.scrape_timeout_s,
        health.xid_overrides,
    )
    assert not GpuHealthConfig(dcgm_url="http://127.0.0.1:9400/metrics").dormant


def test_xid_overrides_accept_codes_spelled_as_json_strings() -> None:
    config = config_of(gpu_health={"xid_overrides": {"79": "nonfatal", 48: "fatal"}})

    assert {79: "nonfatal", 48: "fatal"} == config.gpu_health.xid_overrides  # type: ignore[union-attr]


def test_an_xid_override_must_be_fatal_or_nonfatal() -> None:
    assert [
        "gpu_health.xid_overrides.79: expected 'fatal' or 'nonfatal', got 'meh'"
    ] == problems_of_document(document(gpu_health={"xid_overrides": {79: "meh"}}))


def test_endpoints_come_from_url_or_urls_without_trailing_slashes() -> None:
    one = UpstreamConfig(id="a", url="http://127.0.0.1:8001/", models=["m"])
    many = UpstreamConfig(id="b", urls=["http://127.0.0.1:8001", "https://h/v/"], models=["m"])

    assert ("http://127.0.0.1:8001",) == one.endpoints
    assert ("http://127.0.0.1:8001", "https://h/v") == many.endpoints


def test_the_first_byte_timeout_defaults_to_45_s_and_null_means_the_timeout() -> None:
    """45 s: a silent provider holds a client well under ~100 s (issue #13; docs/dataplane.md)."""
    default = UpstreamConfig(id="a", url="http://h", models=["m"])
    unset = UpstreamConfig(id="a", url="http://h", models=["m"], first_byte_timeout_s=None)
    assert (45.0, 300.0) == (
        default.effective_first_byte_timeout_s,
        unset.effective_first_byte_timeout_s,
    )


def test_lookups_find_upstreams_runtimes_and_models() -> None:
    config = config_of(
        upstreams=[
            upstream("qwen", models=("qwen", "qwen-mini")),
            upstream("tei", models=("bge",)),
        ],
        runtimes=[{"id": "local", "kind": "upstream"}, push_runtime(models=("llama",))],
    )

    assert "tei" == config.upstream("tei").id
    assert "push" == config.runtime("home-1").kind
    assert ["bge", "qwen", "qwen-mini"] == config.served_models()
    assert ["bge", "qwen", "qwen-mini"] == config.runtime_models("local")
    assert ["llama"] == config.runtime_models("home-1")
    assert ["qwen"] == [u.id for u in config.upstreams_serving("qwen-mini")]
    with pytest.raises(KeyError, match="no runtime 'cloud' \\(defined: local, home-1\\)"):
        config.runtime("cloud")
    with pytest.raises(KeyError, match="no upstream 'x'"):
        config.upstream("x")


def test_a_config_is_frozen() -> None:
    config = config_of()

    with pytest.raises(ValueError, match="frozen"):
        config.listen = "0.0.0.0:1"  # type: ignore[misc]


def test_the_summary_shows_listen_store_health_upstreams_runtimes_and_chain() -> None:
    config = GatewayConfig.model_validate(
        document(
            gpu_health={"dcgm_url": "http://127.0.0.1:9400/metrics"},
            upstreams=[upstream(gpu_ids=[0])],
            runtimes=[{"id": "local", "kind": "upstream"}, push_runtime()],
        )
    )

    assert [
        "listen          127.0.0.1:8080",
        "store           sqlite:///./gpugate.db",
        "admin           token from $GPUGATE_ADMIN_TOKEN",
        (
            "gpu health      http://127.0.0.1:9400/metrics (every 15s, faults remove upstreams,"
            " batch shed off at 95% x4)"
        ),
        "upstream        qwen: http://127.0.0.1:8001 models=qwen gpus=0 max_inflight=64",
        "runtime         local (upstream) models=(every upstream model)",
        "runtime         home-1 (push) models=qwen max_concurrency=2 budget=1000c/day",
        "fallback chain  local -> home-1",
        "default runtime local",
    ] == config.summary_lines()


def test_the_summary_says_when_gpu_health_is_dormant_and_admin_is_off() -> None:
    lines = config_of(admin_token_env=None).summary_lines()

    assert "gpu health      dormant (no dcgm_url or exporters)" in lines
    assert "admin           off (no admin_token_env: the admin API refuses everything)" in lines
