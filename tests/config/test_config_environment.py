"""Secrets live in environment variables named by ``*_env`` keys; which ones must be set."""

from __future__ import annotations

import textwrap

import pytest
from config_factories import config_of, document, modal_runtime, push_runtime, upstream

from gpugate.config import config_from_document, env_problems, parse_config
from gpugate.errors import ConfigError, ConfigProblem

PUSH_FILE = textwrap.dedent("""\
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
          secret_env: HOME1_WORKER_SECRET
    """)


def test_an_unset_push_secret_is_a_problem_at_its_key_and_line() -> None:
    config = parse_config(PUSH_FILE)

    assert [
        ConfigProblem(
            "runtimes[0].push.secret_env",
            "environment variable HOME1_WORKER_SECRET is not set",
            11,
        )
    ] == env_problems(config, {})


def test_an_empty_push_secret_is_a_problem_too() -> None:
    config = parse_config(PUSH_FILE)

    assert [
        (
            "runtimes[0].push.secret_env: environment variable HOME1_WORKER_SECRET is set but empty"
            " (line 11)"
        )
    ] == [str(problem) for problem in env_problems(config, {"HOME1_WORKER_SECRET": ""})]


def test_a_set_push_secret_is_no_problem() -> None:
    assert [] == env_problems(parse_config(PUSH_FILE), {"HOME1_WORKER_SECRET": "s3cret"})


def test_modal_needs_both_token_variables_even_when_left_at_their_defaults() -> None:
    config = config_of(runtimes=[modal_runtime()])

    assert [
        "runtimes[0].modal.token_id_env: environment variable MODAL_TOKEN_ID is not set",
        "runtimes[0].modal.token_secret_env: environment variable MODAL_TOKEN_SECRET is not set",
    ] == [str(problem) for problem in env_problems(config, {})]


def test_an_upstream_api_key_is_required_only_when_named() -> None:
    config = config_of(
        upstreams=[upstream("qwen", api_key_env="QWEN_KEY"), upstream("tei", models=("bge",))]
    )

    assert ["upstreams[0].api_key_env: environment variable QWEN_KEY is not set"] == [
        str(problem) for problem in env_problems(config, {})
    ]


def test_the_admin_token_is_not_required() -> None:
    """Unset, the admin API refuses everything; the gateway still starts."""
    assert [] == env_problems(config_of(admin_token_env="GPUGATE_ADMIN_TOKEN"), {})


def test_require_env_adds_the_unset_variables_to_the_other_problems() -> None:
    doc = document(runtimes=[push_runtime()], fallback_chain=["home-1", "gone"])

    with pytest.raises(ConfigError) as caught:
        config_from_document(doc, environ={}, require_env=True)

    assert [
        "runtimes[0].push.secret_env: environment variable HOME1_WORKER_SECRET is not set",
        "fallback_chain[1]: names runtime 'gone', which is not defined (defined: home-1)",
    ] == [str(problem) for problem in caught.value.problems]


def test_require_env_passes_when_every_variable_is_set() -> None:
    config = parse_config(PUSH_FILE, environ={"HOME1_WORKER_SECRET": "x"}, require_env=True)

    assert "HOME1_WORKER_SECRET" == config.runtime("home-1").push.secret_env  # type: ignore[union-attr]


def test_a_secret_written_where_a_variable_name_belongs_is_refused() -> None:
    with pytest.raises(ConfigError) as caught:
        config_of(
            runtimes=[push_runtime(push={"url": "http://127.0.0.1:9100", "secret_env": "hunter2!"})]
        )

    assert [
        (
            "runtimes[0].push.secret_env: expected the name of an environment variable (letters,"
            " digits and '_', not starting with a digit), got 'hunter2!'; the secret itself never"
            " goes here"
        )
    ] == [str(problem) for problem in caught.value.problems]
