"""docs/operations.md's "Config versions" section names which keys live in the store and which
always come from the file; both lists are read against the config's own models, so a key added
to either side cannot leave the operators' guide behind (session 15: `models` was missing from
the first, `blobs`, `retention`, `telemetry` and `auth` from the second)."""

from __future__ import annotations

import re
from pathlib import Path

from gpugate.config import GatewayConfig
from gpugate.config.schema import GATEWAY_KEYS

OPERATIONS = Path(__file__).resolve().parents[2] / "docs" / "operations.md"


def _listed(after: str) -> set[str]:
    """The backquoted names in the parentheses that follow ``after`` in the guide."""
    text = " ".join(OPERATIONS.read_text().split())
    start = text.index(after) + len(after)
    inside = text[start : text.index(")", start)]
    return set(re.findall(r"`([a-z_]+)`", inside))


def test_the_guide_names_exactly_the_gateway_keys_kept_in_the_store() -> None:
    assert set(GATEWAY_KEYS) == _listed("the *gateway config* (")


def test_the_guide_names_exactly_the_process_keys_read_from_the_file() -> None:
    process = set(GatewayConfig.model_fields) - set(GATEWAY_KEYS)
    assert process == _listed("The process keys (")
