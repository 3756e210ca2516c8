"""Another revision of gpugate to measure beside today's in the same run (``bench/proxy.py
--baseline REV``): the revision exported with ``git archive`` into its own folder under the
bench cache (``~/.cache/gpugate-bench/baseline-<sha>/``) and installed, with its own pinned
dependencies (its ``constraints.txt``), into a venv of its own (:class:`venvs.Venv`), so the
baseline runs its own code on its own library versions. Made once per revision.

Only the revision's gpugate is used: the load, the targets and the report are today's, so
the two are measured by the same bench, one after the other on the same core, in one run.
"""

from __future__ import annotations

import io
import subprocess
import tarfile

from venvs import CACHE, HERE, Venv, VenvError


def resolve(rev: str) -> str:
    """The full commit id of ``rev`` in this checkout."""
    done = subprocess.run(
        ["git", "rev-parse", "--verify", f"{rev}^{{commit}}"],
        cwd=HERE,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise VenvError(f"--baseline {rev}: not a commit here ({done.stderr.strip()})")
    return done.stdout.strip()


def baseline_python(rev: str) -> tuple[str, str]:
    """The python of ``rev``'s own venv (its gpugate installed), and the commit id."""
    sha = resolve(rev)
    root = CACHE / f"baseline-{sha[:12]}"
    tree = root / "tree"
    if not (tree / "pyproject.toml").exists():
        print(f"exporting {sha[:12]} into {tree}", flush=True)
        archive = subprocess.run(
            ["git", "archive", "--format=tar", sha],
            cwd=HERE.parent,
            capture_output=True,
            check=False,
        )
        if archive.returncode != 0:
            raise VenvError(f"git archive {sha[:12]} failed: {archive.stderr.decode()[-500:]}")
        tree.mkdir(parents=True, exist_ok=True)
        with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
            tar.extractall(tree, filter="data")
    pins: tuple[str, ...] = (str(tree),)
    if (tree / "constraints.txt").exists():
        pins = ("-c", str(tree / "constraints.txt"), str(tree))
    venv = Venv(f"baseline-{sha[:12]}/venv", pins).ensure()
    return venv.python, sha
