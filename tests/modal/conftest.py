"""The Modal SDK fake (tests/modal/fake_modal) as ``modal``, the reference function deployed in
it, an S3-compatible server (moto) for the results, and a fake model server for the function."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from types import ModuleType

import pytest
from modal_rig import EXAMPLE, FAKE, TOKEN

from gpugate.fleet import ModelServer
from s3_server import s3, s3_blobs

__all__ = ["fleet", "modal_sdk", "reference_function", "s3", "s3_blobs"]


@pytest.fixture
def modal_sdk(monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """The fake imported as ``modal``, its cloud reset, and gone again afterwards."""
    monkeypatch.syspath_prepend(str(FAKE))
    for name in [m for m in sys.modules if m == "modal" or m.startswith("modal.")]:
        monkeypatch.delitem(sys.modules, name)
    sdk = importlib.import_module("modal")
    assert Path(sdk.__file__ or "").is_relative_to(FAKE), "the fake, not a real modal"
    sdk.CLOUD.reset()
    sdk.CLOUD.tokens.add(TOKEN)
    yield sdk
    sdk.CLOUD.hold.set()
    for name in [m for m in sys.modules if m == "modal" or m.startswith("modal.")]:
        del sys.modules[name]


@pytest.fixture
def reference_function(modal_sdk: ModuleType) -> ModuleType:
    """examples/modal_function.py, imported against the fake and deployed to env ``beta``."""
    spec = importlib.util.spec_from_file_location("modal_function", EXAMPLE)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    modal_sdk.CLOUD.deploy(module.app, environment_name="beta")
    return module


@pytest.fixture
async def fleet(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[ModelServer]:
    """The model server the reference function talks to (its ``INFERENCE_URL``)."""
    async with ModelServer(["qwen"], name="m0") as server:
        monkeypatch.setenv("INFERENCE_URL", server.url)
        yield server
