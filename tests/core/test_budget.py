"""The budget rule (DESIGN §5 Guardrails) as arithmetic: over budget at 2 x daily_cents spent
today, and a reservation admitted while the spend before it is below that, whatever its
estimate — the rule the store's atomic reservation applies in SQL (``refuse_at_cents``)."""

from __future__ import annotations

from gpugate.core.budget import Cost, over_budget

# daily_cents 1: over budget at 2; each call estimated at 0.02 c/s x 60 s = 1.2 cents
AUDITED = Cost(estimate_cents=1.2, limit_cents=2.0, cents_per_second=0.02)


def test_a_reservation_is_admitted_below_the_limit_even_when_its_estimate_passes_it() -> None:
    assert [True, True, True, False, False] == [
        AUDITED.admits(spent) for spent in (0.0, 0.9, 1.99, 2.0, 2.4)
    ]


def test_what_a_reservation_refuses_is_what_over_budget_says() -> None:
    for spent in (0.0, 0.9, 1.2, 1.999, 2.0, 2.4):
        assert AUDITED.admits(spent) is not over_budget(spent, daily_cents=1)


def test_float_sums_of_equal_estimates_reach_the_limit_exactly() -> None:
    """Ten estimates of 1.2 sum to 11.999999999999998: that is 12, the limit, and refused."""
    spent = sum([1.2] * 10)
    ten = Cost(estimate_cents=1.2, limit_cents=12.0, cents_per_second=0.02)
    assert (False, True) == (ten.admits(spent), over_budget(spent, daily_cents=6))


def test_a_budget_of_zero_admits_nothing() -> None:
    nothing = Cost(estimate_cents=1.0, limit_cents=0.0, cents_per_second=0.1)
    assert (False, True) == (nothing.admits(0.0), over_budget(0.0, daily_cents=0))
