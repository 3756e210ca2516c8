"""The built image, started and talked to (deploy/container/smoke.py), where it can run.

It needs a container engine and the image built by deploy/container/build.sh (minutes: two
Debian bases and the wheelhouse), so it runs where ``GPUGATE_TEST_IMAGE`` names a built image
and is skipped, with one notice line, elsewhere (CI does not build the image). ENGINE and
ENGINE_FLAGS are passed through (this sandbox: ``--runtime runc`` and explicit ulimits).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

SMOKE = Path(__file__).resolve().parents[2] / "deploy" / "container" / "smoke.py"


def test_the_image_serves_answers_and_stops_cleanly_on_sigterm() -> None:
    image = os.environ.get("GPUGATE_TEST_IMAGE")
    if not image:
        pytest.skip("container smoke test: set GPUGATE_TEST_IMAGE to a built image to run it")
    result = subprocess.run(
        [sys.executable, str(SMOKE), "--image", image],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    print(result.stdout, result.stderr)
    assert "skipped" not in result.stdout, result.stdout  # asked for: it must run
    assert 0 == result.returncode
    assert 6 == result.stdout.count("ok  ")
