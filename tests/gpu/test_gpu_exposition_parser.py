"""Our exposition parser against prometheus_client's, the reference.

Whatever the body — a real scrape, generated valid text, mangled text — ours either refuses it
with ScrapeError or returns exactly the samples prometheus_client reads from it, with every name as
the text writes it. On valid text, ours must not refuse.
"""

from __future__ import annotations

import math

import pytest
from gpu_factories import fixture_dir
from gpu_strategies import PROFILE, SEEDS, TOKENS, expositions, mutated
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from gpugate.adapters.exposition import parse
from gpugate.errors import ScrapeError

Row = tuple[str, dict[str, str], float | str]  # NaN as "NaN": NaN != NaN


class Refused(Exception):
    """prometheus_client's parser refused the body."""


def reference(body: str | bytes) -> list[Row]:
    """prometheus_client's samples of ``body``, named as written.

    prometheus_client renames the samples of a ``counter`` to end in ``_total``. Its samples are
    the same when every ``# TYPE x counter`` says ``gauge`` (both allow the one name ``x``), and
    then carry the name as written; so the body is read twice, as is (does it refuse?) and so
    rewritten (the names).
    """
    try:
        text = body.decode() if isinstance(body, bytes) else body
        as_is = _rows(text)
        as_written = _rows("\n".join(_counter_as_gauge(line) for line in text.split("\n")))
    # What prometheus_client raises: ValueError for a malformed line (UnicodeDecodeError is one
    # too), OverflowError for an integer timestamp beyond a float. Anything else fails the test.
    except (ValueError, OverflowError) as exc:
        raise Refused from exc
    assert [row[1:] for row in as_is] == [row[1:] for row in as_written]
    return as_written


def _rows(text: str) -> list[Row]:
    return [
        (sample.name, dict(sample.labels), _comparable(sample.value))
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    ]


def _counter_as_gauge(line: str) -> str:
    stripped = line.strip()  # prometheus_client strips every line
    if stripped.startswith("#") and stripped.endswith("counter"):
        return stripped.removesuffix("counter") + "gauge"
    return line


def _comparable(value: float) -> float | str:
    try:
        number = float(value)  # prometheus_client keeps integers as int, of any size
    except OverflowError:
        number = math.inf if value > 0 else -math.inf
    return "NaN" if math.isnan(number) else number


def ours(body: str | bytes, names: frozenset[str] | None = None) -> list[Row]:
    return [
        (sample.name, dict(sample.labels), _comparable(sample.value))
        for sample in parse(body, names)
    ]


def agrees(body: str | bytes) -> bool:
    """Ours refuses ``body``, or reads what the reference reads (and the reference accepts it)."""
    try:
        mine = ours(body)
    except ScrapeError:
        return True
    return mine == reference(body)


FIXTURES = sorted(path.name for path in fixture_dir().glob("*.prom"))


@pytest.mark.parametrize("name", FIXTURES)
def test_every_real_scrape_reads_as_prometheus_client_reads_it(name: str) -> None:
    body = (fixture_dir() / name).read_bytes()

    actual = ours(body)

    assert reference(body) == actual
    assert actual  # every fixture holds samples


def test_the_fixtures_are_all_there() -> None:
    assert 9 == len(FIXTURES)


@PROFILE
@given(expositions())
def test_valid_exposition_text_reads_as_prometheus_client_reads_it(text: str) -> None:
    assert reference(text) == ours(text)


@PROFILE
@given(expositions(), st.data())
def test_a_names_filter_keeps_the_samples_of_those_names_in_order(
    text: str, data: st.DataObject
) -> None:
    every = ours(text)
    names = frozenset(data.draw(st.lists(st.sampled_from([row[0] for row in every] or ["x"]))))

    assert [row for row in every if row[0] in names] == ours(text, names)


@PROFILE
@given(mutated())
def test_a_mangled_real_scrape_is_refused_or_read_as_prometheus_client_reads_it(
    body: str | bytes,
) -> None:
    assert agrees(body)


@PROFILE
@given(mutated(expositions().filter(bool)))
def test_mangled_generated_text_is_refused_or_read_as_prometheus_client_reads_it(
    body: str | bytes,
) -> None:
    assert agrees(body)


@PROFILE
@given(st.lists(st.sampled_from(TOKENS) | st.characters(), max_size=80).map("".join))
def test_random_text_is_refused_or_read_as_prometheus_client_reads_it(body: str) -> None:
    assert agrees(body)


@pytest.mark.parametrize(
    "line",
    [
        'DCGM_FI_DEV_GPU_UTIL{gpu="0",modelName="NVIDIA H',  # cut inside the label set
        'DCGM_FI_DEV_GPU_UTIL{gpu="0"}',  # cut before the value
        "DCGM_FI_DEV_GPU_UT",  # cut inside the name
        'DCGM_FI_DEV_GPU_UTIL{gpu="0} 1',  # an unterminated label value
        'DCGM_FI_DEV_GPU_UTIL{gpu="0",gpu="1"} 1',  # a label twice
        'DCGM_FI_DEV_GPU_UTIL{__name__="x"} 1',  # a reserved label name
        'DCGM_FI_DEV_GPU_UTIL{gpu="0"} 1 2 3',  # fields after the timestamp
        'DCGM_FI_DEV_GPU_UTIL{gpu="0"} 1_000',  # a digit separator
        'DCGM_FI_DEV_GPU_UTIL{gpu="0"} 1 1.5',  # a timestamp that is not an integer
        "# TYPE DCGM_FI_DEV_GPU_UTIL",  # a TYPE line without a type
        "# TYPE DCGM_FI_DEV_GPU_UTIL meter",  # an unknown type
        "# HELP 0DCGM not a name",
        "<html><body>502 Bad Gateway</body></html>",
    ],
)
def test_a_malformed_line_among_good_ones_is_a_scrape_error(line: str) -> None:
    good = 'DCGM_FI_DEV_GPU_TEMP{gpu="0"} 40'

    with pytest.raises(ScrapeError):
        parse(f"{good}\n{line}\n{good}\n")


@pytest.mark.parametrize(
    "line",
    [
        'DCGM_FI_DEV_GPU_UTIL{gpu="0",modelName="NVIDIA H',
        "# TYPE DCGM_FI_DEV_GPU_UTIL meter",
        "DCGM_FI_DEV_GPU_UT",
    ],
)
def test_a_malformed_line_is_refused_even_when_its_name_is_filtered_out(line: str) -> None:
    with pytest.raises(ScrapeError):
        parse(line + "\n", names=frozenset({"DCGM_FI_DEV_GPU_TEMP"}))


def test_label_values_are_unescaped_and_anything_else_is_kept() -> None:
    (sample,) = parse(r'x{a="back\\slash",b="quote\"d",c="new\nline",d="tab\t",e="}{,="} 1')

    expected = {"a": "back\\slash", "b": 'quote"d', "c": "new\nline", "d": "tab\\t", "e": "}{,="}
    assert expected == dict(sample.labels)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("NaN", "NaN"),
        ("+Inf", math.inf),
        ("-Inf", -math.inf),
        ("1.5e+3", 1500.0),
        ("-2E-3", -0.002),
        ("9223372036854775794", 9223372036854775794.0),
    ],
)
def test_values_read_as_the_format_spells_them(text: str, expected: float | str) -> None:
    assert [("x", {}, expected)] == ours(f"x {text} 1700000000000\n")


def test_a_trailing_comma_and_blanks_inside_the_label_set_are_allowed() -> None:
    assert [("x", {"a": "1", "b": "2"}, 3.0)] == ours('x{ a = "1" ,b="2", } 3\n')


def test_the_same_label_set_is_one_shared_mapping() -> None:
    """Parsed once: every sample of a GPU shares its labels, within a scrape and across scrapes."""
    labels = '{gpu="0",Hostname="node-a"}'
    body = f"DCGM_FI_DEV_GPU_TEMP{labels} 40\nDCGM_FI_DEV_GPU_UTIL{labels} 91\n"

    first, second = parse(body)
    (again, _) = parse(body)

    assert first.labels is second.labels is again.labels


def test_crlf_line_ends_read_like_lf() -> None:
    body = '# TYPE x gauge\r\nx{a="b"} 1\r\n\r\ny 2\r\n'

    assert reference(body) == ours(body) == ours(body.replace("\r\n", "\n"))


def test_a_body_that_is_empty_or_only_comments_is_zero_samples() -> None:
    assert ([], []) == (ours(""), ours("# HELP x a family with no samples\n# TYPE x gauge\n\n"))


def test_the_seeds_of_the_mangling_are_themselves_read_as_prometheus_client_reads_them() -> None:
    """Checks the checker: the texts the mutations start from are valid, save a cut first or
    last line."""
    for seed in SEEDS:
        whole_lines = "\n".join(seed.split("\n")[1:-1])
        assert ours(whole_lines)
        assert reference(whole_lines) == ours(whole_lines)
