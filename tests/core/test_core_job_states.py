"""The job domain in core: the states, the moves between them, the typed lease."""

from __future__ import annotations

import pytest

from gpugate.core.job_states import JOB_STATES, TRANSITIONS, JobState, check_transition
from gpugate.core.lease import RESERVED_CALL, Lease, LeaseKind, stored_lease


def test_every_state_is_in_the_transition_table_and_terminal_ones_lead_nowhere_but_a_retry() -> (
    None
):
    assert set(JOB_STATES) == {state.value for state in TRANSITIONS}
    assert frozenset() == TRANSITIONS[JobState.COMPLETED] == TRANSITIONS[JobState.CANCELLED]
    assert {JobState.QUEUED} == TRANSITIONS[JobState.FAILED]


@pytest.mark.parametrize(
    ("current", "new"),
    [
        ("completed", "queued"),
        ("queued", "running"),
        ("cancelled", "dispatching"),
        ("failed", "running"),
    ],
)
def test_a_move_the_table_does_not_allow_is_refused(current: str, new: str) -> None:
    with pytest.raises(ValueError, match=f"a {current} job cannot become {new}"):
        check_transition(current, new)


def test_staying_in_a_state_is_no_move_and_is_allowed() -> None:
    assert "running" == check_transition("running", "running")


def test_each_lease_shows_its_holder_and_only_a_runtimes_lease_is_a_call() -> None:
    claim, slot, call = Lease.claim("r-1"), Lease.reservation("rt"), Lease.of_call("rt", "c-1")

    assert ["j1-dispatcher@r-1", "rt:~reserved", "rt:c-1"] == [
        lease.text("j1") for lease in (claim, slot, call)
    ]
    assert [None, ("rt", RESERVED_CALL), ("rt", "c-1")] == [
        each.call for each in (claim, slot, call)
    ]


def test_a_lease_is_read_back_from_its_columns() -> None:
    columns = Lease.of_call("rt", "c-1").columns()
    assert Lease(LeaseKind.CALL, "rt", "c-1") == stored_lease(*columns.values())
    assert stored_lease(None, None, None, None) is None
