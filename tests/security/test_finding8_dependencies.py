"""Finding 8 (issue #15): dependency floors that admitted releases with published advisories,
and no constraints file. The floors now sit at or above the fixed version of every advisory we
know of (docs/security.md lists them), and CI installs the pinned, tested versions."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]

# The newest fixed version of the advisories published against each dependency we use
# (docs/security.md, "Dependencies"): a floor below it admits a vulnerable release.
ADVISORIES_FIXED_IN = {
    "starlette": "1.3.1",  # CVE-2026-54283 (and 54282, 48710, 2025-62727 before it)
    "aiohttp": "3.14.3",  # GHSA-cq5v-8q36-5273 (and the 3.14.1/3.14.2/3.13.x batches)
    "python-multipart": "0.0.31",  # GHSA-v9pg-7xvm-68hf (and 0.0.30, 0.0.27, 0.0.22, 0.0.18)
    "jinja2": "3.1.6",  # CVE-2025-27516 (and CVE-2024-56201/56326)
}


def _requirements() -> dict[str, Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    lines = [*project["dependencies"], *project["optional-dependencies"]["dev"]]
    return {canonicalize_name(Requirement(line).name): Requirement(line) for line in lines}


def _floor(requirement: Requirement) -> Version:
    floors = [Version(s.version) for s in requirement.specifier if s.operator == ">="]
    assert floors, f"{requirement.name} has no >= floor"
    return max(floors)


def _pins() -> dict[str, Version]:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            pins[canonicalize_name(name.strip())] = Version(version.strip())
    return pins


def test_finding8_no_dependency_floor_admits_a_release_with_a_published_advisory() -> None:
    requirements = _requirements()
    below = {
        name: str(_floor(requirements[name]))
        for name, fixed in ADVISORIES_FIXED_IN.items()
        if _floor(requirements[name]) < Version(fixed)
    }
    assert {} == below


def test_finding8_ci_installs_with_the_constraints_file() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(r"pip install .*-c constraints\.txt .*'\.\[dev\]'", ci)


def test_finding8_the_constraints_pin_every_dependency_within_its_floor() -> None:
    pins = _pins()
    requirements = _requirements()
    missing = sorted(name for name in requirements if name not in pins)
    outside = {
        name: str(pins[name])
        for name, requirement in requirements.items()
        if name in pins and not requirement.specifier.contains(pins[name], prereleases=True)
    }
    assert ([], {}) == (missing, outside)
