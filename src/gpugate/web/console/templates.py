"""The console's Jinja2 templates (the one module that imports jinja2), autoescaped.

A page renders whole, or — for the live refresh — only its ``live`` block
(:meth:`Templates.render` with ``fragment=True``), so one template serves both.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import jinja2


def _when(value: str | None) -> str:
    """An ISO time as ``HH:MM:SS`` UTC (with the date when it is not today)."""
    if not value:
        return "—"
    try:
        moment = datetime.fromisoformat(value).astimezone(UTC)
    except ValueError:
        return value
    if moment.date() == datetime.now(UTC).date():
        return moment.strftime("%H:%M:%S")
    return moment.strftime("%Y-%m-%d %H:%M:%S")


def _tidy(value: Any) -> Any:
    """Floats of a recorded detail to a millionth, in and below dicts and lists: sums of float
    cents show ``2.00472``, not ``2.0047200000000003``."""
    if isinstance(value, float):
        return round(value, 6)
    if isinstance(value, dict):
        return {k: _tidy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_tidy(v) for v in value]
    return value


def _cents(value: float | None) -> str:
    return "—" if value is None else f"${value / 100:,.2f}"


class Templates:
    """Renders the console's pages from the package's ``templates/`` directory."""

    def __init__(self) -> None:
        self._env = jinja2.Environment(
            loader=jinja2.PackageLoader("gpugate.web.console", "templates"),
            autoescape=True,
            undefined=jinja2.StrictUndefined,
            trim_blocks=True,
            lstrip_blocks=True,
        )
        self._env.filters["when"] = _when
        self._env.filters["cents"] = _cents
        self._env.filters["tidy"] = _tidy

    def render(self, name: str, context: dict[str, Any], *, fragment: bool = False) -> str:
        template = self._env.get_template(name)
        if not fragment:
            return template.render(context)
        block = template.blocks["live"]
        return "".join(block(template.new_context(context)))

    def __repr__(self) -> str:
        return f"<Templates {len(self._env.list_templates())} templates>"
