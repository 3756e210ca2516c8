"""The benchmarks' own virtualenvs, under ``~/.cache/gpugate-bench/``: what is measured beside
gpugate but must not be one of its dependencies.

* ``vllm-router``: vLLM's Rust router from PyPI (a Python launcher around a Rust server), the
  peer that issue #21 measures gpugate against.
* ``candidates``: the libraries of the hot-path prototypes (``hotpath_*.py``): granian,
  pyreqwest, orjson, msgspec, and py-spy for ``profile_proxy.py``; plus uvloop, httptools,
  aiohttp, uvicorn and prometheus_client at the versions gpugate uses, so a prototype and
  gpugate run on the same libraries. The prototypes import gpugate's pure core (``picking``,
  ``admission``) from the work tree's ``src/`` through ``PYTHONPATH``, never an installed copy.

Each is made once with ``python -m venv`` and ``pip install`` of pinned versions; a marker file
holds what was installed, so a change of pins makes the venv again. Set ``GPUGATE_BENCH_CACHE``
to put them elsewhere.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
CACHE = Path(os.environ.get("GPUGATE_BENCH_CACHE", Path.home() / ".cache" / "gpugate-bench"))
SRC = HERE.parent / "src"  # gpugate's pure core, for the prototypes


class VenvError(Exception):
    """A venv could not be made (pip failed: no registry, a pin gone)."""


@dataclass(frozen=True)
class Venv:
    name: str
    pins: tuple[str, ...]

    @property
    def path(self) -> Path:
        return CACHE / self.name

    def bin(self, tool: str) -> str:
        return str(self.path / "bin" / tool)

    @property
    def python(self) -> str:
        return self.bin("python")

    def ensure(self) -> Venv:
        """Make the venv (once per set of pins) and return it."""
        marker = self.path / "gpugate-bench-pins.txt"
        wanted = "\n".join(self.pins) + "\n"
        if marker.exists() and marker.read_text() == wanted:
            return self
        print(f"installing {', '.join(self.pins)} into {self.path}", flush=True)
        shutil.rmtree(self.path, ignore_errors=True)
        base = getattr(sys, "_base_executable", sys.executable)  # not the project venv's
        subprocess.run([base, "-m", "venv", str(self.path)], check=True)
        pip = [self.python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
        done = subprocess.run([*pip, *self.pins], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise VenvError(f"pip install into {self.path} failed:\n{done.stderr[-2000:]}")
        marker.write_text(wanted)
        return self


VLLM_ROUTER = Venv("vllm-router", ("vllm-router==0.1.17",))
CANDIDATES = Venv(
    "candidates",
    (
        "granian==2.8.7",
        "pyreqwest==0.15.1",
        "orjson==3.13.0",
        "msgspec==0.22.0",
        "py-spy==0.4.3",
        "uvloop==0.23.0",
        "httptools==0.9.0",
        "aiohttp==3.14.5",
        "uvicorn==0.54.0",
        "prometheus_client==0.26.0",
    ),
)


def candidate_env() -> dict[str, str]:
    """The environment of a prototype: gpugate's ``src/`` and ``bench/`` importable."""
    path = os.pathsep.join([str(SRC), str(HERE)])
    return {**os.environ, "PYTHONPATH": path}
