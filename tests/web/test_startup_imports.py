"""What a serving gateway imports: libraries only some configurations use stay out of its memory.

Every module imported is code held resident for the process's life (issue #21: RSS with 1,000
open streams <= 100 MB); aiohttp and its family alone are ~10 MB. A fresh interpreter builds
the whole app, as ``gpugate serve`` does, and lists what it imported.
"""

from __future__ import annotations

import subprocess
import sys

BUILD_THE_APP = """
import sys
import gpugate.cli, gpugate.server, gpugate.web.app, gpugate.wiring
print(" ".join(sorted(sys.modules)))
"""


def test_building_the_app_imports_no_aiohttp_until_a_push_worker_is_called() -> None:
    done = subprocess.run(
        [sys.executable, "-c", BUILD_THE_APP], capture_output=True, text=True, check=True
    )
    modules = set(done.stdout.split())
    assert "gpugate.web.app" in modules
    assert not {"aiohttp", "yarl", "multidict"} & modules
