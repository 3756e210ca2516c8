"""The composition root builds whole parts (issue #17 done-when 2): the Gateway is frozen, every
field is given at construction, two builds share no part, and neither the root nor the web
layer sets anything on a part after it was built."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from gpugate.services.runtimes.table import Runtimes
from gpugate.telemetry import NO_TRACER
from gpugate.wiring import Gateway, LiveConfig, build_gateway
from harness import make_config, upstream

SRC = Path(__file__).resolve().parents[2] / "src" / "gpugate"
UPSTREAM = [upstream("a", ["http://127.0.0.1:9"], ["m"])]
#: Fields that hold values, not parts: the same object in two builds is no shared state.
VALUES = frozenset({"environ", "started_at", "tracer"})


def test_every_gateway_field_is_required_and_none_is_left_for_later() -> None:
    fields = dataclasses.fields(Gateway)
    assert fields, "Gateway is a dataclass"
    later = [
        f.name
        for f in fields
        if not f.init
        or f.default is not dataclasses.MISSING
        or f.default_factory is not dataclasses.MISSING
    ]
    assert [] == later


async def test_a_built_gateway_is_frozen_and_whole(sqlite_dsn: str) -> None:
    config = make_config(sqlite_dsn, UPSTREAM)
    async with build_gateway(config, environ={}, run_job_loops=False) as gateway:
        with pytest.raises(dataclasses.FrozenInstanceError):
            gateway.jobs = gateway.jobs  # type: ignore[misc]
        with pytest.raises((dataclasses.FrozenInstanceError, TypeError)):  # no setter either
            gateway.stopping = True  # type: ignore[misc]
        empty = [f.name for f in dataclasses.fields(Gateway) if getattr(gateway, f.name) is None]
        assert ["monitor"] == empty  # gpu_health is dormant here: None from the start
        assert gateway.registry.guard is None
        assert isinstance(gateway.runtimes, Runtimes)
        assert ["local"] == list(gateway.runtimes)  # the default runtime, built with the table
        assert isinstance(gateway.live, LiveConfig)
        assert (gateway.config, gateway.config_version) == gateway.live.current()


async def test_two_builds_share_no_part(tmp_path: Path) -> None:
    first = make_config(f"sqlite:///{tmp_path / 'a.db'}", UPSTREAM)
    second = make_config(f"sqlite:///{tmp_path / 'b.db'}", UPSTREAM)
    async with (
        build_gateway(first, environ={}, run_job_loops=False) as a,
        build_gateway(second, environ={}, run_job_loops=False) as b,
    ):
        shared = [
            f.name
            for f in dataclasses.fields(Gateway)
            if f.name not in VALUES
            and getattr(a, f.name) is not None
            and getattr(a, f.name) is getattr(b, f.name)
        ]
        assert [] == shared
        assert a.tracer is NO_TRACER is b.tracer  # the one stateless no-op, by design


async def test_a_config_version_applied_to_one_gateway_leaves_the_other_alone(
    tmp_path: Path,
) -> None:
    first = make_config(f"sqlite:///{tmp_path / 'a.db'}", UPSTREAM)
    second = make_config(f"sqlite:///{tmp_path / 'b.db'}", UPSTREAM)
    async with (
        build_gateway(first, environ={}, run_job_loops=False) as a,
        build_gateway(second, environ={}, run_job_loops=False) as b,
    ):
        more = make_config(first.store, [*UPSTREAM, upstream("b", ["http://127.0.0.1:10"], ["n"])])
        a.apply_config(more, a.config_version + 1)
        assert (2, ["a", "b"]) == (a.config_version, [u.id for u in a.registry.upstreams()])
        assert (1, ["a"]) == (b.config_version, [u.id for u in b.registry.upstreams()])


#: The attribute writes on a built part that are allowed, by (function, target).
ALLOWED_WRITES = {
    # A new config version's routing policy, swapped whole by the one reconfiguration.
    ("apply", "router.policy"),
    # An SSL context being made, before any part holds it.
    ("_push_tls", "context.minimum_version"),
}


def _attribute_writes(path: Path) -> set[tuple[str, str]]:
    """Every ``x.attr = ...`` in ``path`` whose ``x`` is not ``self``: (function, target)."""
    found: set[tuple[str, str]] = set()
    for func in ast.walk(ast.parse(path.read_text())):
        if not isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for node in ast.walk(func):
            targets = node.targets if isinstance(node, ast.Assign) else []
            if isinstance(node, ast.AugAssign | ast.AnnAssign):
                targets = [node.target]
            for target in targets:
                for leaf in ast.walk(target):
                    if isinstance(leaf, ast.Attribute):
                        root = leaf.value
                        while isinstance(root, ast.Attribute):
                            root = root.value
                        if not (isinstance(root, ast.Name) and root.id == "self"):
                            found.add((func.name, ast.unparse(leaf)))
    return found


def test_the_composition_root_sets_nothing_on_a_part_after_building_it() -> None:
    assert set() == _attribute_writes(SRC / "wiring.py") - ALLOWED_WRITES


def test_the_web_layer_sets_nothing_on_the_gateway_or_its_services() -> None:
    writes = set()
    for path in sorted((SRC / "web").rglob("*.py")):
        writes |= {
            (f"{path.name}:{func}", target)
            for func, target in _attribute_writes(path)
            if target.startswith(("gateway.", "gw.")) or "gateway." in target
        }
    assert set() == writes


async def test_no_part_of_the_root_shows_the_environment_in_its_repr(sqlite_dsn: str) -> None:
    config = make_config(sqlite_dsn, UPSTREAM)
    environ = {"UPSTREAM_KEY": "sk-do-not-print"}
    async with build_gateway(config, environ=environ, run_job_loops=False) as gateway:
        shown = [repr(gateway), repr(gateway.reconfigurer), repr(gateway.live)]
        assert [] == [text for text in shown if "sk-do-not-print" in text]
