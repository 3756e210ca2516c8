"""One answer to "is this status retryable" (issue #17): every place that turns an HTTP status
into "try again" or "that is the answer" agrees with :func:`gpugate.retry.retryable` — the
``upstream`` runtime, the push runtime's submit, the push worker's report of its model server's
answer and the worker's delivery of a report to the gateway."""

from __future__ import annotations

import random

import pytest

from gpugate.adapters.push_client import PushClient
from gpugate.clock import ManualClock
from gpugate.errors import RuntimeAuthFailed, RuntimeBusy
from gpugate.retry import Backoff, retryable
from gpugate.services.runtimes.push import PushRuntime
from gpugate.services.runtimes.upstream import _answered
from gpugate.worker.calls import Push, answered
from gpugate.worker.links import Answer

#: Every kind of non-2xx answer except the three with names of their own (429, 401, 403).
NOT_OK = [300, 304, 400, 404, 408, 409, 413, 422, 425, 500, 501, 502, 503, 504, 505, 520, 599]
PUSH = Push("s1", "m", "batch", "chat/completions", {}, "token", None)


@pytest.mark.parametrize("status", NOT_OK)
def test_the_upstream_runtime_retries_exactly_what_retry_says(status: int) -> None:
    ended = _answered(status, b'{"error": {"message": "no"}}')
    assert ("failed", retryable(status), not retryable(status)) == (
        ended.state,
        ended.retryable,
        ended.terminal,
    )


@pytest.mark.parametrize("status", NOT_OK)
def test_the_worker_reports_a_model_server_answer_retryable_exactly_when_retry_says(
    status: int,
) -> None:
    report = answered("c1", PUSH, status, b"no", 0.1)
    assert ("fail", retryable(status)) == (report.kind, report.body["retryable"])


@pytest.mark.parametrize("status", [*NOT_OK, 401, 403, 429])
def test_the_worker_sends_a_report_again_exactly_when_retry_says(status: int) -> None:
    assert Answer(status).settled is not retryable(status)


def test_a_report_with_no_answer_or_taken_is_sent_again_or_done() -> None:
    assert (False, True) == (Answer(0, error="refused").settled, Answer(204).settled)


@pytest.mark.parametrize("status", NOT_OK)
def test_the_push_runtime_retries_a_refused_submit_exactly_when_retry_says(status: int) -> None:
    runtime = PushRuntime(
        "home", "http://127.0.0.1:9", "s", PushClient(), ManualClock(), gateway_url="http://x"
    )
    assert retryable(status) is runtime._refusal(status, None).retryable


def test_the_push_runtime_names_busy_and_auth_refusals_for_what_they_are() -> None:
    runtime = PushRuntime(
        "home", "http://127.0.0.1:9", "s", PushClient(), ManualClock(), gateway_url="http://x"
    )
    kinds = [type(runtime._refusal(s, None)) for s in (429, 401, 403)]
    assert [RuntimeBusy, RuntimeAuthFailed, RuntimeAuthFailed] == kinds


def test_a_report_waits_a_jittered_backoff_under_the_same_ceilings() -> None:
    backoff = Backoff(0.2, 5.0, random.Random(7))
    waits = [backoff.delay(n) for n in range(1, 9)]
    assert all(0 <= w <= backoff.ceiling(n) for n, w in enumerate(waits, start=1))
    assert len({round(w, 6) for w in waits}) == len(waits)  # drawn, not a fixed doubling
