"""docs/architecture.md lists every module of gpugate with its layer and what it is (issue #17
done-when 6): the table is generated from the code and must be current."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_module_table_is_current_and_every_module_says_what_it_is() -> None:
    check = subprocess.run(
        [sys.executable, str(ROOT / "docs" / "module_table.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert (0, "") == (check.returncode, check.stderr)


def test_every_module_has_a_layer() -> None:
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    assert len(rows) >= len(list((ROOT / "src" / "gpugate").rglob("*.py"))) - 2
    assert [] == [row for row in rows if "| ? |" in row]
