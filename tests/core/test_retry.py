from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest

from gpugate.retry import Backoff, is_load_signal, parse_retry_after, retryable

NOW = datetime(2026, 12, 1, 9, 0, 0, tzinfo=UTC)


@pytest.mark.parametrize("status", [408, 425, 429, 500, 502, 503, 504])
def test_not_acted_on_429_and_the_transient_5xx_are_retryable(status: int) -> None:
    assert retryable(status)


@pytest.mark.parametrize(
    "status", [200, 201, 301, 400, 401, 403, 404, 409, 413, 422, 501, 505, 520, 599]
)
def test_every_other_status_is_an_answer_not_a_reason_to_retry(status: int) -> None:
    assert not retryable(status)


def test_only_429_and_503_are_load_signals() -> None:
    assert [429, 503] == [s for s in (400, 429, 500, 502, 503, 504) if is_load_signal(s)]


def test_the_backoff_ceiling_doubles_from_the_base_up_to_the_cap() -> None:
    backoff = Backoff(base_s=0.5, max_s=4.0)
    assert [0.5, 1.0, 2.0, 4.0, 4.0] == [backoff.ceiling(n) for n in range(1, 6)]


def test_a_huge_attempt_number_is_capped_without_overflow() -> None:
    assert 4.0 == Backoff(base_s=0.5, max_s=4.0).ceiling(10_000)


def test_before_any_failed_attempt_there_is_no_wait() -> None:
    assert 0.0 == Backoff(base_s=0.5, max_s=4.0).ceiling(0)


def test_full_jitter_draws_every_wait_between_zero_and_the_ceiling() -> None:
    backoff = Backoff(base_s=1.0, max_s=8.0, rng=random.Random(3))
    waits = [backoff.delay(3) for _ in range(2000)]
    assert all(0.0 <= wait <= 4.0 for wait in waits)
    assert min(waits) < 0.2  # spread over the whole range, not bunched near the ceiling
    assert max(waits) > 3.8


def test_negative_backoff_times_are_refused() -> None:
    with pytest.raises(ValueError, match="negative"):
        Backoff(base_s=-1.0, max_s=1.0)


@pytest.mark.parametrize(
    ("value", "expected"), [("2", 2.0), (b"120", 120.0), (" 7 ", 7.0), ("1.5", 1.5), ("0", 0.0)]
)
def test_retry_after_in_seconds_is_read_as_seconds(value: str | bytes, expected: float) -> None:
    assert expected == parse_retry_after(value, NOW)


def test_retry_after_as_an_http_date_is_the_time_until_that_date() -> None:
    value = format_datetime(NOW + timedelta(seconds=30), usegmt=True)
    assert 30.0 == parse_retry_after(value, NOW)


def test_retry_after_as_a_date_in_the_past_means_now() -> None:
    value = format_datetime(NOW - timedelta(hours=1), usegmt=True)
    assert 0.0 == parse_retry_after(value, NOW)


@pytest.mark.parametrize("value", [None, "", "soon", "-3", "nan", "inf", "Wed, 99 Foo 2015"])
def test_an_absent_or_unreadable_retry_after_is_none(value: str | None) -> None:
    assert parse_retry_after(value, NOW) is None
