"""The XID severity table: which XID codes mean "take this GPU out of rotation".

The table is data shipped with the package (``xid_severity.csv``, NVIDIA's immediate-action
buckets; its header says where each row comes from and the judgment calls, XID 109 among them).
Operators override single codes (``gpu_health.xid_overrides: {109: fatal}``). A code the table does
not list is *unknown*: not fatal, and described as ``unknown XID n`` so an operator sees it.
"""

from __future__ import annotations

import csv
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from types import MappingProxyType
from typing import Literal

Severity = Literal["fatal", "nonfatal"]

_CSV = "xid_severity.csv"
_COLUMNS = ["code", "mnemonic", "immediate_action", "severity"]
_SEVERITIES = {"FATAL": True, "NONFATAL": False}
_NO_OVERRIDES: Mapping[int, Severity] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class XidEntry:
    """One row of the table."""

    code: int
    mnemonic: str  # empty when NVIDIA gives none
    immediate_action: str
    fatal: bool


class XidTable:
    """XID code → severity, with operator overrides applied. Immutable once built."""

    __slots__ = ("_entries", "_overrides")

    def __init__(
        self, entries: Mapping[int, XidEntry], overrides: Mapping[int, Severity] = _NO_OVERRIDES
    ) -> None:
        self._entries = MappingProxyType(dict(entries))
        self._overrides = MappingProxyType({code: _fatal(s) for code, s in overrides.items()})

    @classmethod
    def load(cls, overrides: Mapping[int, Severity] = _NO_OVERRIDES) -> XidTable:
        """The packaged table with ``overrides`` (code → ``"fatal"``/``"nonfatal"``) applied."""
        text = resources.files("gpugate.core.gpu").joinpath(_CSV).read_text(encoding="utf-8")
        return cls(parse_table(text), overrides)

    def entry(self, code: int) -> XidEntry | None:
        """The table's row for ``code`` (overrides not applied), or None when unknown."""
        return self._entries.get(code)

    def is_fatal(self, code: int) -> bool:
        """Whether ``code`` faults a GPU: the override, else the table; unknown codes are not."""
        if code in self._overrides:
            return self._overrides[code]
        known = self._entries.get(code)
        return known is not None and known.fatal

    def describe(self, code: int) -> str:
        """For people: ``XID 79 (GPU_HAS_FALLEN_OFF_THE_BUS): fatal``, ``unknown XID 200``."""
        if code == 0:
            return "no XID"
        known = self._entries.get(code)
        if code in self._overrides:
            verdict = "fatal" if self._overrides[code] else "not fatal"
            name = f" ({known.mnemonic})" if known and known.mnemonic else ""
            return f"XID {code}{name}: {verdict} (override)"
        if known is None:
            return f"unknown XID {code}"
        name = f" ({known.mnemonic})" if known.mnemonic else ""
        return f"XID {code}{name}: {'fatal' if known.fatal else 'not fatal'}"

    def fatal_codes(self) -> frozenset[int]:
        """Every code that faults a GPU, overrides applied."""
        codes = {code for code in self._entries if self.is_fatal(code)}
        codes |= {code for code, fatal in self._overrides.items() if fatal}
        return frozenset(codes)

    def __repr__(self) -> str:
        return (
            f"<XidTable codes={len(self._entries)} fatal={len(self.fatal_codes())}"
            f" overrides={len(self._overrides)}>"
        )


def parse_table(text: str) -> dict[int, XidEntry]:
    """The rows of a severity CSV (``#`` lines are comments); raises ValueError naming the line."""
    lines = [line for line in text.splitlines() if line.strip() and not line.startswith("#")]
    rows = csv.reader(lines)
    header = next(rows, None)
    if header != _COLUMNS:
        raise ValueError(f"{_CSV}: expected the header {','.join(_COLUMNS)}, got {header}")
    entries: dict[int, XidEntry] = {}
    for number, row in enumerate(rows, start=2):
        if len(row) != len(_COLUMNS) or not row[0].isdigit() or row[3] not in _SEVERITIES:
            raise ValueError(f"{_CSV}: row {number} is not code,mnemonic,action,FATAL|NONFATAL")
        code = int(row[0])
        if code in entries:
            raise ValueError(f"{_CSV}: row {number} repeats XID {code}")
        entries[code] = XidEntry(code, row[1].strip(), row[2].strip(), _SEVERITIES[row[3]])
    return entries


def _fatal(severity: str) -> bool:
    if severity == "fatal":
        return True
    if severity == "nonfatal":
        return False
    raise ValueError(f"an XID override is 'fatal' or 'nonfatal', got {severity!r}")
