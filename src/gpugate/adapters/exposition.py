"""Prometheus text exposition (format 0.0.4) → plain :class:`Sample` values.

:func:`parse` turns a scrape body into frozen samples (name, read-only labels, value) that the core
reads without knowing the format. Anything that is not exposition text — an HTML error page, a body
cut in the middle of a label set, bytes that are not UTF-8 — raises
:class:`~gpugate.errors.ScrapeError`, translated once, here. A body that parses but holds no DCGM
series is *not* an error at this level: :func:`gpugate.core.gpu.dcgm.readings` finds no GPU in it,
and :func:`gpugate.core.gpu.dcgm.require_gpus` turns that into
:class:`~gpugate.errors.NoGpuSeries`.

The grammar (https://prometheus.io/docs/instrumenting/exposition_formats/), one line at a time:

* blank lines and ``# comments`` are skipped; ``# HELP name doc`` and ``# TYPE name type`` are
  checked and skipped (a malformed one is an error, as for prometheus_client);
* a sample is ``name{label="value",...} value [timestamp]``: the label set may be empty or
  absent, may end in a comma, and its values escape ``\\\\``, ``\\"`` and ``\\n`` (any other
  backslash is kept as it is); the value is a float as Go reads one (``NaN``, ``+Inf``, ``-Inf``,
  exponents, any case); the timestamp is int64 milliseconds, checked and dropped;
* names come through exactly as written: nothing is renamed (prometheus_client adds ``_total``
  to the samples of a ``counter``; dcgm-exporter declares e.g.
  ``DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION`` one, and the core looks series up by the printed name).

It is stricter than prometheus_client's lax parser, never laxer: every body this module accepts,
prometheus_client accepts too and reads as the same samples (``tests/gpu/
test_gpu_exposition_parser.py`` checks that against real scrapes, generated exposition text and
mutated garbage). Refused where prometheus_client shrugs: extra fields after the timestamp, a
non-integer timestamp, a label set with a leading comma, label names with ``:``, quoted (UTF-8)
names, types outside the five of 0.0.4.

Speed: the monitor parses every exporter on every poll, and a 64-GPU dcgm-exporter scrape is
1,664 lines with one of 128 label sets each. Lines are split with ``str`` methods; each distinct
label set (the text between the braces) is parsed once and its read-only mapping is shared by
every sample that repeats it, within a scrape and across scrapes (a bounded LRU cache of a pure
function). ``names`` (best a frozenset) limits which samples are built, never what is checked.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from functools import lru_cache
from types import MappingProxyType

from gpugate.errors import ScrapeError

_SHOWN_CHARS = 80  # of a refused line quoted in an error message
_LABEL_SETS = 4096  # distinct label sets remembered: ~128 per 64-GPU exporter
_NAMES = 1024  # distinct metric names remembered: ~40 per dcgm-exporter

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_PAIR = r'([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*"([^"\\]*(?:\\.[^"\\]*)*)"'  # name="escaped value"
_PAIRS = re.compile(_PAIR, re.DOTALL)
_LABEL_SET = re.compile(  # pairs with commas between, maybe one after; blanks around. Possessive
    # quantifiers: no backtracking, so a long malformed set fails in linear time.
    rf"[ \t]*+(?:{_PAIR}[ \t]*+(?:,[ \t]*+{_PAIR}[ \t]*+)*+(?:,[ \t]*+)?+)?+",
    re.DOTALL,
)
_ESCAPE = re.compile(r'\\[\\n"]')
_UNESCAPED = {"\\\\": "\\", "\\n": "\n", '\\"': '"'}
_VALUE_AND_TIMESTAMP = re.compile(r"[ \t]*([^ \t]+)[ \t]+([+-]?)([0-9]+)")
_DIRECTIVE = re.compile(
    r"#[ \t]+(HELP|TYPE)[ \t]+([a-zA-Z_:][a-zA-Z0-9_:]*)(?:[ \t]+(.*))?", re.DOTALL
)
_TYPES = frozenset({"counter", "gauge", "histogram", "summary", "untyped"})
_COMMENT_WORDS = re.compile(r"[ \t\n\r\x0b\x0c]+")  # how prometheus_client splits a comment
_INT64 = 1 << 63
_INT64_DIGITS = 19  # of 2**63 - 1; int() of a longer digit string is slow, then refused anyway
_NO_LABELS: Mapping[str, str] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class Sample:
    """One sample line: metric name, labels (a read-only mapping), value."""

    name: str
    labels: Mapping[str, str]
    value: float


def parse(body: str | bytes, names: Collection[str] | None = None) -> list[Sample]:
    """Every sample of a text-exposition body, in order; only those named in ``names`` if given.

    Every line is checked whatever ``names`` says: a malformed line anywhere raises
    :class:`~gpugate.errors.ScrapeError`, and so do bytes that are not UTF-8.
    """
    number, line = 0, ""
    samples: list[Sample] = []
    keep = samples.append
    try:
        text = body.decode() if isinstance(body, bytes) else body
        for number, line in enumerate(text.split("\n"), 1):  # noqa: B007 - the except reads it
            sample = _sample(line.strip(), names)
            if sample is not None:
                keep(sample)
    except ValueError as exc:  # ours, and UnicodeDecodeError
        where = f"line {number} {_shorten(line.strip())!r}: " if number else ""
        raise ScrapeError(f"not Prometheus text exposition: {where}{_shorten(str(exc))}") from exc
    return samples


def _sample(line: str, names: Collection[str] | None) -> Sample | None:
    """The sample of one stripped line; ValueError if malformed.

    None for a blank line, a ``#`` line, or a sample whose name is not in ``names`` (checked all
    the same).
    """
    if not line:
        return None
    if line[0] == "#":
        _comment(line)
        return None
    brace = line.find("{")
    if brace >= 0:
        close = line.rfind("}")
        if close < brace:
            raise ValueError("label set not closed")
        name = line[:brace]
        labels = _labels(line[brace + 1 : close])
        rest = line[close + 1 :]
    else:
        name, rest = _split_name(line)
        labels = _NO_LABELS
    if "_" in rest:  # float() reads digit separators; the format has none
        raise ValueError("'_' in a value")
    try:
        value = float(rest)  # the usual line: one value, no timestamp
    except ValueError:
        value = _value_and_timestamp(rest)
    _name(name)
    return Sample(name, labels, value) if names is None or name in names else None


def _split_name(line: str) -> tuple[str, str]:
    """A sample line without labels as (name, the rest): the name ends at a space or a tab."""
    space, tab = line.find(" "), line.find("\t")
    end = tab if space < 0 or 0 <= tab < space else space
    if end < 0:
        raise ValueError("no value")
    return line[:end], line[end + 1 :]


@lru_cache(maxsize=_NAMES)
def _name(name: str) -> str:
    """``name`` when it is a metric name, else ValueError. Pure, so cached."""
    if _NAME.fullmatch(name) is None:
        raise ValueError("invalid metric name")
    return name


@lru_cache(maxsize=_LABEL_SETS)
def _labels(raw: str) -> Mapping[str, str]:
    """The labels between a sample's braces, read-only; ValueError when malformed. Pure, so cached.

    The mapping is shared by every sample with this label set, so it must never be writable.
    """
    if _LABEL_SET.fullmatch(raw) is None:
        raise ValueError("malformed label set")
    pairs = _PAIRS.findall(raw)  # in a well-formed set, exactly its pairs, in order
    labels = {
        name: _ESCAPE.sub(_unescape, value) if "\\" in value else value for name, value in pairs
    }
    if len(labels) < len(pairs):
        raise ValueError("a label name twice")
    if any(name.startswith("__") for name in labels):
        raise ValueError("a reserved label name (starting with __)")
    return MappingProxyType(labels)


def _unescape(match: re.Match[str]) -> str:
    return _UNESCAPED[match.group()]


def _value_and_timestamp(text: str) -> float:
    """The value of ``text`` (what follows the name or labels) that has a timestamp too.

    The timestamp is checked and dropped. ``float`` reads what Go's ``ParseFloat`` does, save
    ``_`` digit separators (refused before, as by prometheus_client) and hex floats.
    """
    match = _VALUE_AND_TIMESTAMP.fullmatch(text)
    if match is None:
        raise ValueError("expected a value and at most a timestamp")
    value, sign, digits = match.groups()
    if len(digits) > _INT64_DIGITS or not -_INT64 <= int(sign + digits) < _INT64:
        raise ValueError("timestamp outside int64 milliseconds")
    return float(value)


def _comment(line: str) -> None:
    """Check a ``#`` line: ``# HELP name ...`` and ``# TYPE name type`` must be well formed.

    A line whose second word is HELP or TYPE but that does not read as one is refused, as
    prometheus_client refuses it; so is one that has a quote in it and mentions either (that
    parser splits words around quoted text). Any other comment is skipped unread.
    """
    if "HELP" not in line and "TYPE" not in line:
        return
    directive = _DIRECTIVE.fullmatch(line)
    if directive is None:
        words = _COMMENT_WORDS.split(line, maxsplit=2)
        if '"' in line or words[1:2] == ["HELP"] or words[1:2] == ["TYPE"]:
            raise ValueError("malformed HELP or TYPE line")
        return
    keyword, name, rest = directive.groups()
    if keyword == "TYPE" and rest not in _TYPES:
        raise ValueError("no metric type, or not one of " + ", ".join(sorted(_TYPES)))
    if keyword == "TYPE" and rest == "counter" and name == "_total":
        raise ValueError("a counter named _total has no name left")  # as prometheus_client says


def _shorten(text: str) -> str:
    if len(text) <= _SHOWN_CHARS:
        return text
    return text[: _SHOWN_CHARS - 1] + "…"
