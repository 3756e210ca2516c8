"""docs/configuration.md covers every config key and is exactly what the models generate."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "docs" / "config_reference.py"


@pytest.fixture(scope="module")
def reference() -> ModuleType:
    spec = importlib.util.spec_from_file_location("config_reference", SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_every_config_key_of_the_models_has_a_meaning(reference: ModuleType) -> None:
    assert [] == reference.missing()


def test_the_reference_file_is_what_the_models_generate_now(reference: ModuleType) -> None:
    """Stale? Run `python docs/config_reference.py`."""
    assert reference.render() == reference.TARGET.read_text()


def test_a_key_without_a_meaning_is_reported_and_marked_in_the_file(
    reference: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    meaning = dict(reference.MEANING)
    del meaning["gpu_health.shed_batch"]
    meaning["gpu_health.no_such_key"] = "gone"
    monkeypatch.setattr(reference, "MEANING", meaning)
    assert ["gpu_health.shed_batch", "gpu_health.no_such_key (no such key)"] == reference.missing()
    assert "| `gpu_health.shed_batch` | bool | `false` | **undocumented** |" in reference.render()


def test_every_documented_path_is_a_real_key_including_each_runtime_kind(
    reference: ModuleType,
) -> None:
    paths = {k.path: k for k in reference.all_keys()}
    assert ("push",) == paths["runtimes[].push.url"].kinds
    assert ("modal",) == paths["runtimes[].idle_exit_s"].kinds
    assert "required" == paths["upstreams"].default
