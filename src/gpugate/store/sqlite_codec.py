"""How the SQLite store writes what SQLite has no type for: times as text, JSON as text."""

from __future__ import annotations

import json
from datetime import UTC, datetime


def json_text(value: object) -> str:
    """Compact JSON, non-ASCII kept as is."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def time_text(moment: datetime) -> str:
    """Fixed-width ISO-8601 UTC, so that text order is time order."""
    return moment.astimezone(UTC).isoformat(timespec="microseconds")


def text_time(text: str) -> datetime:
    """The aware UTC time :func:`time_text` wrote."""
    return datetime.fromisoformat(text)
