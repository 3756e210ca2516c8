"""The ``push`` runtime against a fake push worker on a real loopback socket: what it sends,
and how each answer of the worker becomes a submission, a call status or a runtime error."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fake_worker import FakeWorker, Scripted

from gpugate.adapters.push_client import PushClient
from gpugate.clock import ManualClock
from gpugate.errors import (
    RuntimeAuthFailed,
    RuntimeBusy,
    RuntimeRefused,
    RuntimeRejected,
    RuntimeTimeout,
    RuntimeUnreachable,
)
from gpugate.services.runtimes import CallStatus, Submission
from gpugate.services.runtimes.push import PushRuntime
from gpugate.store import JobRecord

SECRET = "s3cret-home-1"
NOW = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)


def job(slug: str = "job-1", **changes: Any) -> JobRecord:
    """A job as the dispatcher holds it when it submits."""
    fields: dict[str, Any] = {
        "id": 1,
        "slug": slug,
        "idempotency_key": None,
        "model": "qwen",
        "job_class": "batch",
        "operation": "chat/completions",
        "input": {"messages": [{"role": "user", "content": "hi"}]},
        "input_ref": None,
        "runner": "home-1",
        "state": "dispatching",
        "attempts": {},
        "submit_count": 0,
        "rescue_count": 0,
        "leased_by": f"{slug}-dispatcher",
        "lease_token": "tok-1",
        "lease_expires_at": NOW,
        "not_before": None,
        "allow_external": True,
        "result": None,
        "result_ref": None,
        "error_code": None,
        "error_message": None,
        "cost_cents": None,
        "created_at": NOW,
        "updated_at": NOW,
        "finished_at": None,
    }
    fields.update(changes)
    return JobRecord(**fields)


@pytest.fixture
async def client() -> AsyncIterator[PushClient]:
    # push.auth: bearer, as the fake worker speaks: what the runtime makes of each answer does
    # not depend on the signing, which tests/security/test_finding6_push_signing.py pins
    push_client = PushClient(auth="bearer")
    await push_client.start()
    yield push_client
    await push_client.close()


@pytest.fixture
async def worker() -> AsyncIterator[FakeWorker]:
    async with FakeWorker() as fake:
        yield fake


def runtime(url: str, client: PushClient, **knobs: Any) -> PushRuntime:
    return PushRuntime(
        "home-1",
        url,
        SECRET,
        client,
        ManualClock(start=NOW),
        gateway_url="http://127.0.0.1:8080",
        cents_per_second=0.5,
        **knobs,
    )


def refused_url() -> str:
    """An address where nothing listens (a port bound and released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/calls"


async def test_submit_posts_the_job_with_the_secret_and_answers_a_call_not_yet_running(
    worker: FakeWorker, client: PushClient
) -> None:
    submission = await runtime(worker.url, client).submit(job(), "tok-1")

    assert Submission("call-1", running=False) == submission
    [sent] = worker.received
    assert ("POST", "/calls", f"Bearer {SECRET}") == (sent.method, sent.path, sent.authorization)
    assert {
        "slug": "job-1",
        "model": "qwen",
        "class": "batch",
        "operation": "chat/completions",
        "input": {"messages": [{"role": "user", "content": "hi"}]},
        "lease_token": "tok-1",
        "gateway_url": "http://127.0.0.1:8080",
        "deadline": (NOW + timedelta(hours=1)).isoformat(),
    } == sent.body


@pytest.mark.parametrize(
    ("status", "error"),
    [
        (429, RuntimeBusy),
        (401, RuntimeAuthFailed),
        (403, RuntimeAuthFailed),
        (400, RuntimeRejected),
        (422, RuntimeRejected),
        (500, RuntimeUnreachable),
        (503, RuntimeUnreachable),
    ],
)
async def test_a_refused_submit_raises_the_runtime_error_the_dispatcher_walks_by(
    worker: FakeWorker, client: PushClient, status: int, error: type[Exception]
) -> None:
    worker.answers["POST", "/calls"] = Scripted(status, {"error": {"message": "no"}})

    with pytest.raises(error, match="no"):
        await runtime(worker.url, client).submit(job(), "tok-1")


async def test_a_submit_accepted_without_a_call_id_is_rejected(
    worker: FakeWorker, client: PushClient
) -> None:
    worker.answers["POST", "/calls"] = Scripted(202, {"id": "x"})

    with pytest.raises(RuntimeRejected, match="without a call_id"):
        await runtime(worker.url, client).submit(job(), "tok-1")


async def test_a_submit_nobody_listens_for_is_unreachable_and_retryable(client: PushClient) -> None:
    with pytest.raises(RuntimeUnreachable) as raised:
        await runtime(refused_url(), client).submit(job(), "tok-1")

    assert raised.value.retryable
    assert isinstance(raised.value, RuntimeRefused)


async def test_a_submit_unanswered_within_its_timeout_is_a_runtime_timeout(
    worker: FakeWorker, client: PushClient
) -> None:
    worker.answers["POST", "/calls"] = Scripted(202, {"call_id": "late"}, delay_s=2)

    with pytest.raises(RuntimeTimeout):
        await runtime(worker.url, client, submit_timeout_s=0.2).submit(job(), "tok-1")


async def test_a_job_whose_input_is_in_a_blob_is_rejected_before_anything_is_sent(
    worker: FakeWorker, client: PushClient
) -> None:
    with pytest.raises(RuntimeRejected, match="blob"):
        await runtime(worker.url, client).submit(job(input_ref="blob-1"), "tok-1")

    assert [] == worker.received


async def test_status_reads_a_running_call(worker: FakeWorker, client: PushClient) -> None:
    worker.statuses["c1"] = {"state": "running"}

    assert CallStatus("running") == await runtime(worker.url, client).status("c1")
    assert ("GET", "/calls/c1") == (worker.received[0].method, worker.received[0].path)


async def test_a_completed_call_carries_its_result_and_its_reported_cost(
    worker: FakeWorker, client: PushClient
) -> None:
    worker.statuses["c1"] = {"state": "completed", "result": {"ok": 1}, "cost_cents": 3}

    status = await runtime(worker.url, client).status("c1")

    assert CallStatus("completed", result={"ok": 1}, cost_cents=3.0) == status


async def test_a_completed_call_without_a_cost_costs_its_duration_times_cents_per_second(
    worker: FakeWorker, client: PushClient
) -> None:
    worker.statuses["c1"] = {"state": "completed", "result": "x", "duration_s": 4}

    status = await runtime(worker.url, client).status("c1")

    assert 2.0 == status.cost_cents  # 4 s x 0.5 cents/s


async def test_a_call_failed_for_good_is_terminal_and_a_retryable_one_is_not(
    worker: FakeWorker, client: PushClient
) -> None:
    worker.statuses["bad"] = {"state": "failed", "error_code": "UPSTREAM_400", "retryable": False}
    worker.statuses["busy"] = {"state": "failed", "error_code": "UPSTREAM_503", "retryable": True}
    push = runtime(worker.url, client)

    bad, busy = await push.status("bad"), await push.status("busy")

    assert ("UPSTREAM_400", False, True) == (bad.error_code, bad.retryable, bad.terminal)
    assert ("UPSTREAM_503", True, False) == (busy.error_code, busy.retryable, busy.terminal)


async def test_a_call_the_worker_does_not_hold_is_unknown(
    worker: FakeWorker, client: PushClient
) -> None:
    assert CallStatus("unknown") == await runtime(worker.url, client).status("gone")


async def test_a_worker_whose_port_refuses_the_connection_holds_no_call(client: PushClient) -> None:
    """The process is gone: the reaper may take the job back at once."""
    assert CallStatus("unknown") == await runtime(refused_url(), client).status("c1")


async def test_a_worker_too_slow_to_answer_cannot_say_so_the_call_is_kept(
    worker: FakeWorker, client: PushClient
) -> None:
    worker.answers["GET", "/calls/c1"] = Scripted(200, {"state": "running"}, delay_s=2)

    with pytest.raises(RuntimeTimeout):
        await runtime(worker.url, client, status_timeout_s=0.2).status("c1")


async def test_a_status_without_a_valid_state_cannot_say(
    worker: FakeWorker, client: PushClient
) -> None:
    worker.statuses["c1"] = {"state": "sleeping"}

    with pytest.raises(RuntimeUnreachable, match="no valid state"):
        await runtime(worker.url, client).status("c1")


async def test_cancel_deletes_the_call_and_never_raises(
    worker: FakeWorker, client: PushClient
) -> None:
    await runtime(worker.url, client).cancel("c1")
    await runtime(refused_url(), client).cancel("c1")

    assert [("DELETE", "/calls/c1")] == [(r.method, r.path) for r in worker.received]
