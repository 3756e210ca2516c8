"""Hypothesis strategies for the GPU-health tests: valid exposition text, and scrapes mangled.

Deterministic (``derandomize``) and with no example database (:data:`PROFILE`), so every run
tries the same cases.
"""

from __future__ import annotations

import math

from gpu_factories import dcgm_line, fixture_bytes
from hypothesis import settings
from hypothesis import strategies as st

PROFILE = settings(max_examples=200, derandomize=True, database=None, deadline=None)


def format_value(value: float) -> str:
    """A number as the exposition writes it (Go's spelling of NaN and the infinities)."""
    if not isinstance(value, float):
        return repr(value)  # an int, of any size
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)


# --- valid text exposition 0.0.4 -------------------------------------------------------------

METRIC_NAMES = st.from_regex(r"[a-zA-Z_:][a-zA-Z0-9_:]{0,15}", fullmatch=True)
LABEL_NAMES = st.from_regex(r"[a-zA-Z_][a-zA-Z0-9_]{0,10}", fullmatch=True).filter(
    lambda name: not name.startswith("__")  # reserved
)
LABEL_VALUES = st.text(st.sampled_from('"\\\n{}=,# \t') | st.characters(codec="utf-8"), max_size=12)
TYPES = st.sampled_from(["counter", "gauge", "untyped", "summary", "histogram"])
FLOATS = st.floats(allow_nan=True, allow_infinity=True)
VALUES = st.one_of(
    FLOATS.map(format_value),
    st.integers(-(2**70), 2**70).map(str),
    st.sampled_from(["NaN", "+Inf", "-Inf", "1e3", "1E-3", "-2.5e+10", ".5", "5.", "+3", "-0"]),
    st.sampled_from(["9223372036854775794", "140737488355328", "1e400", "1" + "0" * 400]),
)
TIMESTAMPS = st.none() | st.integers(-(2**63), 2**63 - 1).map(str)
SPACES = st.sampled_from([" ", "\t"])
SUFFIXES = st.sampled_from(["", "", "", "_total", "_count", "_sum", "_bucket"])
COMMENTS = st.text(
    st.characters(codec="ascii", categories=["L", "N", "Zs", "P"], exclude_characters='"'),
    max_size=20,
).filter(lambda text: (text.split() or [""])[0] not in {"HELP", "TYPE"})


def escape_label_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


@st.composite
def sample_lines(draw: st.DrawFn, family: str) -> str:
    """One sample line of ``family`` (or of another name now and then)."""
    name = draw(st.sampled_from([family + draw(SUFFIXES), draw(METRIC_NAMES)]))
    labels = draw(st.dictionaries(LABEL_NAMES, LABEL_VALUES, max_size=4))
    pairs = ",".join(f'{label}="{escape_label_value(value)}"' for label, value in labels.items())
    shape = draw(st.sampled_from(["braces", "braces", "trailing comma", "bare"]))
    if shape == "bare" and not labels:
        head = name
    elif shape == "trailing comma" and labels:
        head = f"{name}{{{pairs},}}"
    else:
        head = f"{name}{{{pairs}}}"
    line = head + draw(SPACES) + draw(VALUES)
    timestamp = draw(TIMESTAMPS)
    return line if timestamp is None else line + draw(SPACES) + timestamp


@st.composite
def families(draw: st.DrawFn) -> list[str]:
    """One metric family: optional HELP and TYPE lines, then its samples and stray comments."""
    name = draw(METRIC_NAMES)
    kind = draw(TYPES)
    if kind == "counter" and name == "_total":
        kind = "gauge"  # prometheus_client strips _total off a counter and refuses the empty name
    lines = []
    if draw(st.booleans()):
        lines.append(f"# HELP {name} {escape_help(draw(st.text(max_size=20)))}".rstrip())
    if draw(st.booleans()):
        lines.append(f"# TYPE {name} {kind}")
    body = st.one_of(
        sample_lines(name),
        sample_lines(name),
        sample_lines(name),
        COMMENTS.map(lambda text: f"# {text}".rstrip()),
        st.sampled_from(["", "  "]),
    )
    return lines + draw(st.lists(body, max_size=4))


@st.composite
def expositions(draw: st.DrawFn) -> str:
    """A whole valid exposition body: families, with or without a final newline."""
    lines = [line for family in draw(st.lists(families(), max_size=5)) for line in family]
    text = "\n".join(lines)
    return text + "\n" if lines and draw(st.booleans()) else text


# --- scrapes mangled ---------------------------------------------------------------------------

SYNTHETIC = "\n".join(
    [
        "# HELP DCGM_FI_DEV_XID_ERRORS Value of the last XID error encountered.",
        "# TYPE DCGM_FI_DEV_XID_ERRORS gauge",
        dcgm_line(
            "DCGM_FI_DEV_XID_ERRORS", 79, err_code="79", err_msg="GPU has fallen off the bus"
        ),
        dcgm_line("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", 65),
        dcgm_line("DCGM_EXP_XID_ERRORS_COUNT", 2, window_size_in_ms="300000", xid="48"),
        dcgm_line("DCGM_EXP_GPU_HEALTH_STATUS", 20, health_watch="ALL"),
        dcgm_line("DCGM_FI_DEV_GPU_UTIL", 99, gpu=1, GPU_I_ID="3"),
        dcgm_line("DCGM_FI_DEV_ROW_REMAP_FAILURE", 1, gpu=1),
    ]
)
SEEDS = [
    fixture_bytes("dcgm-exporter-runai-a100-mig-4instances.prom").decode()[:6000],
    fixture_bytes("dcgm-exporter-aicr-eks-h100-8gpu-k8s-nohelp.prom").decode()[:4000],
    fixture_bytes("dcgm-exporter-datadog-t4-stitched-throttle-unlabeled.prom").decode()[-3000:],
    SYNTHETIC,
]
TOKENS = [
    *'{}",=# \n\t\\.-+e_:',
    "_total",
    "NaN",
    "+Inf",
    "-Inf",
    "9223372036854775794",
    "140737488355328",
    "1e400",
    "9" * 30,
    "9" * 5000,
    " 1" + "0" * 400,  # a timestamp too large for a float
    "# TYPE DCGM_FI_DEV_GPU_UTIL counter\n",
    "# TYPE DCGM_FI_DEV_GPU_TEMP histogram\n",
    "# HELP x\n",
    "\x00",
    "é",
    "\r\n",
    'GPU_I_ID="',
    'xid="79"',
    'gpu="',
    "<html>",
]


@st.composite
def mutated(draw: st.DrawFn, seeds: st.SearchStrategy[str] | None = None) -> str | bytes:
    """A scrape (one of :data:`SEEDS` unless given) with one to three edits: tokens in, text out,
    cut short, repeated, bytes that are not UTF-8."""
    text = draw(seeds if seeds is not None else st.sampled_from(SEEDS))
    for _ in range(draw(st.integers(1, 3))):
        at = draw(st.integers(0, len(text)))
        kind = draw(st.sampled_from(["insert", "line end", "delete", "truncate", "repeat", "text"]))
        if kind == "line end":  # after a sample's value: where timestamps and junk go
            end = text.find("\n", at)
            at = len(text) if end < 0 else end
        if kind in {"insert", "line end"}:
            text = text[:at] + draw(st.sampled_from(TOKENS)) + text[at:]
        elif kind == "delete":
            text = text[:at] + text[at + draw(st.integers(1, 40)) :]
        elif kind == "truncate":
            text = text[:at]
        elif kind == "repeat":
            text = text[:at] + text[max(0, at - 200) : at] + text[at:]
        else:
            text = text[:at] + draw(st.text(max_size=8)) + text[at:]
    if draw(st.integers(0, 7)) == 0:  # now and then, bytes that are not UTF-8
        raw = text.encode()
        at = draw(st.integers(0, len(raw)))
        return raw[:at] + draw(st.binary(max_size=3)) + raw[at:]
    return text


@st.composite
def junk_after_a_value(draw: st.DrawFn) -> str:
    """A whole scrape with one token after one line's value, where a timestamp would go."""
    lines = draw(st.sampled_from(SEEDS)).split("\n")
    at = draw(st.integers(0, len(lines) - 1))
    lines[at] += draw(st.sampled_from([" ", ""])) + draw(st.sampled_from(TOKENS))
    return "\n".join(lines)
