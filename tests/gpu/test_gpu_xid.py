from __future__ import annotations

import pytest

from gpugate.core.gpu.xid import XidEntry, XidTable, parse_table

NVIDIA_FATAL = {
    *(46, 48, 54, 62, 64, 74, 78, 79, 95, 110, 119, 120, 136, 140, 143),
    *range(144, 151),
    *(151, 155, 156, 158, 160, 162),
}
NVIDIA_NONFATAL = {13, 31, 43, 45, 63, 92, 94, 109, 154}


def test_the_packaged_table_faults_exactly_nvidias_fatal_bucket() -> None:
    assert NVIDIA_FATAL == XidTable.load().fatal_codes()


@pytest.mark.parametrize("code", sorted(NVIDIA_NONFATAL))
def test_application_and_ignore_class_xids_are_not_fatal(code: int) -> None:
    table = XidTable.load()

    assert table.entry(code) is not None
    assert not table.is_fatal(code)


def test_xid_109_is_not_fatal_by_default_and_an_override_makes_it_fatal() -> None:
    """Disputed in NVIDIA's own file; the CSV header says why gpugate starts with NONFATAL."""
    assert (False, True) == (
        XidTable.load().is_fatal(109),
        XidTable.load({109: "fatal"}).is_fatal(109),
    )


def test_an_override_can_make_a_fatal_code_not_fatal() -> None:
    table = XidTable.load({79: "nonfatal"})

    assert not table.is_fatal(79)
    assert "XID 79 (GPU_HAS_FALLEN_OFF_THE_BUS): not fatal (override)" == table.describe(79)


def test_an_unknown_code_is_not_fatal_and_described_as_unknown() -> None:
    table = XidTable.load()

    assert (False, "unknown XID 200") == (table.is_fatal(200), table.describe(200))


def test_an_unknown_code_made_fatal_by_override_faults() -> None:
    table = XidTable.load({200: "fatal"})

    assert (True, "XID 200: fatal (override)") == (table.is_fatal(200), table.describe(200))


def test_descriptions_name_the_mnemonic_and_the_severity() -> None:
    table = XidTable.load()

    actual = [table.describe(code) for code in (79, 94, 162, 0)]

    assert [
        "XID 79 (GPU_HAS_FALLEN_OFF_THE_BUS): fatal",
        "XID 94 (CONTAINED_ERROR): not fatal",
        "XID 162: fatal",
        "no XID",
    ] == actual


def test_a_row_keeps_nvidias_immediate_action() -> None:
    assert XidEntry(48, "GPU_ECC_DBE", "WORKFLOW_XID_48", fatal=True) == XidTable.load().entry(48)


def test_an_override_that_is_neither_fatal_nor_nonfatal_is_refused() -> None:
    with pytest.raises(ValueError, match="'fatal' or 'nonfatal'"):
        XidTable.load({79: "FATAL"})  # type: ignore[dict-item]


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ("code,mnemonic,severity\n79,X,FATAL\n", "expected the header"),
        ("code,mnemonic,immediate_action,severity\n79,X,RESET_GPU,MAYBE\n", "row 2"),
        ("code,mnemonic,immediate_action,severity\n79,X,A,FATAL\n79,Y,B,FATAL\n", "repeats"),
    ],
)
def test_a_broken_severity_csv_is_refused_naming_the_problem(text: str, complaint: str) -> None:
    with pytest.raises(ValueError, match=complaint):
        parse_table(text)


def test_the_table_repr_sums_it_up() -> None:
    assert "<XidTable codes=37 fatal=29 overrides=1>" == repr(XidTable.load({13: "fatal"}))
