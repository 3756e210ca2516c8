"""YAML from outside is bounded before it is built: depth, aliases expanded, storable values.

A 300-byte alias bomb once expanded to 7.9 GB in ``PUT /admin/config`` (issue 14, defect 4),
and a 10,000-deep document raised RecursionError (defect 7).
"""

from __future__ import annotations

import itertools
import textwrap
from pathlib import Path

from config_factories import problems_of_yaml

from gpugate.config import load_config
from gpugate.config.untrusted import MAX_DEPTH, MAX_YAML_NODES
from gpugate.errors import ConfigError


def alias_bomb(levels: int = 9, width: int = 9) -> str:
    """Each level a list of ``width`` aliases of the level before: ``width ** levels`` values."""
    names = [chr(ord("a") + i) for i in range(levels)]
    lines = [f"{names[0]}: &{names[0]} [{', '.join(['lol'] * width)}]"]
    lines += [
        f"{name}: &{name} [{', '.join([f'*{before}'] * width)}]"
        for before, name in itertools.pairwise(names)
    ]
    return "\n".join(lines) + "\n"


def test_an_alias_bomb_is_refused_at_the_line_where_it_passes_the_limit() -> None:
    bomb = alias_bomb()
    assert len(bomb) < 400

    problems = problems_of_yaml(bomb)

    expected = f"the document holds more than {MAX_YAML_NODES} values, its aliases expanded"
    assert [f"(document): {expected} (line 6)"] == problems


def test_a_document_nested_past_the_depth_limit_is_one_problem_not_a_recursion_error() -> None:
    deep = "upstreams: " + "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1) + "\n"
    ten_thousand_deep = "upstreams: " + "[" * 10_000 + "]" * 10_000 + "\n"

    assert [f"(document): the document nests deeper than {MAX_DEPTH} levels (line 1)"] == (
        problems_of_yaml(deep)
    )
    assert 1 == len(problems_of_yaml(ten_thousand_deep))


def test_an_alias_that_reaches_past_the_depth_limit_is_refused_too() -> None:
    half = MAX_DEPTH // 2 + 1
    text = f"a: &a {'[' * half}{']' * half}\nb: {'[' * half}*a{']' * half}\n"

    assert [f"(document): the document nests deeper than {MAX_DEPTH} levels (line 2)"] == (
        problems_of_yaml(text)
    )


def test_a_document_that_contains_itself_is_refused() -> None:
    problems = problems_of_yaml("upstreams: &loop [*loop]\n")

    expected = (
        "alias *loop refers to an anchor that is not complete here "
        "(undefined, or a document that contains itself)"
    )
    assert [f"(document): {expected} (line 1)"] == problems


def test_ordinary_anchors_and_aliases_still_work() -> None:
    text = textwrap.dedent("""\
        upstreams:
          - {id: a, url: "http://127.0.0.1:8001", models: &models [qwen, llama]}
          - {id: b, url: "http://127.0.0.1:8002", models: *models}
        """)

    assert [] == problems_of_yaml(text)


def upstream_yaml(extra: str) -> str:
    return f'upstreams:\n  - id: a\n    url: "http://127.0.0.1:8001"\n{extra}'


def test_values_no_store_can_hold_are_problems_with_their_path_and_line() -> None:
    nul = upstream_yaml('    models: ["q\\0wen"]\n')
    surrogate = upstream_yaml('    models: ["q\\ud800"]\n')
    nan = upstream_yaml("    models: [qwen]\n    timeout_s: .nan\n")

    assert ["upstreams[0].models[0]: text holds a NUL character (\\u0000) (line 4)"] == (
        problems_of_yaml(nul)
    )
    assert 1 == len(problems_of_yaml(surrogate))  # libyaml's parser refuses it, else we do
    assert problems_of_yaml(surrogate)[0].endswith("(line 4)")
    assert ["upstreams[0].timeout_s: expected a finite number, got nan (line 5)"] == (
        problems_of_yaml(nan)
    )


def test_the_config_file_is_read_with_the_same_limits(tmp_path: Path) -> None:
    path = tmp_path / "gateway.yaml"
    path.write_text(alias_bomb(), encoding="utf-8")

    try:
        load_config(path)
    except ConfigError as exc:
        messages = [problem.message for problem in exc.problems]
    assert [f"the document holds more than {MAX_YAML_NODES} values, its aliases expanded"] == (
        messages
    )
