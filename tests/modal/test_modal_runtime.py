"""The ``modal`` runtime against the SDK fake: the reference function (examples/) runs in the
fake's cloud, asks a fake model server, and writes its result through a presigned URL into an
S3-compatible server (moto) — where the runtime's poll reads it."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from modal_rig import TOKEN

from gpugate.adapters.blobs import BlobStore, LocalBlobs
from gpugate.adapters.modal_calls import ModalCalls
from gpugate.adapters.s3_blobs import S3Blobs
from gpugate.clock import ManualClock
from gpugate.errors import RuntimeAuthFailed, RuntimeRejected, RuntimeUnreachable
from gpugate.fleet import ModelServer
from gpugate.services.runtimes.base import CallStatus
from gpugate.services.runtimes.modal import ModalRuntime, result_key
from gpugate.store import JobRecord

CHAT = {"messages": [{"role": "user", "content": "hello"}]}
pytestmark = pytest.mark.usefixtures("fleet")


def job(slug: str = "j1") -> JobRecord:
    now = datetime.now(UTC)
    return JobRecord(
        id=1, slug=slug, idempotency_key=None, model="qwen", job_class="batch",
        operation="chat/completions", input=CHAT, input_ref=None, runner="modal-beta",
        state="dispatching", attempts={}, submit_count=0, rescue_count=0,
        leased_by=f"{slug}-dispatcher", lease_token="t", lease_expires_at=None,
        not_before=None, allow_external=True, result=None, result_ref=None, error_code=None,
        error_message=None, cost_cents=None, created_at=now, updated_at=now, finished_at=None,
    )  # fmt: skip


def runtime(
    sdk: ModuleType,
    blobs: BlobStore,
    *,
    function: str = "generate",
    token: tuple[str, str] = TOKEN,
    clock: ManualClock | None = None,
) -> ModalRuntime:
    calls = ModalCalls("worker", function, "beta", *token, sdk=sdk)
    return ModalRuntime("modal-beta", calls, blobs, clock or ManualClock(), cents_per_second=0.05)


async def settled(rt: ModalRuntime, call_id: str, within_s: float = 10.0) -> CallStatus:
    """Poll as the reaper does (bounded) until the call is no longer running."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    while (status := await rt.status(call_id)).state == "running":
        if loop.time() > deadline:
            pytest.fail(f"call {call_id} still running after {within_s} s")
        await asyncio.sleep(0.01)
    return status


async def test_a_job_runs_as_a_modal_call_and_its_result_arrives_through_a_presigned_url(
    modal_sdk: ModuleType, reference_function: ModuleType, s3_blobs: S3Blobs, fleet: ModelServer
) -> None:
    modal_sdk.CLOUD.hold.clear()
    rt = runtime(modal_sdk, s3_blobs)
    submission = await rt.submit(job(), "token")
    assert submission.running
    nonce = submission.call_id.split("+")[1]
    (call,) = modal_sdk.CLOUD.calls.values()
    payload: dict[str, Any] = call.args[0]
    assert ("j1", "qwen", "batch", "chat/completions", CHAT) == (
        payload["slug"], payload["model"], payload["class"], payload["operation"],
        payload["input"],
    )  # fmt: skip
    assert payload["result_put_url"].startswith(s3_blobs_url(s3_blobs))
    assert "X-Amz-Signature=" in payload["result_put_url"]
    assert CallStatus("running") == await rt.status(submission.call_id)

    modal_sdk.CLOUD.hold.set()
    status = await settled(rt, submission.call_id)

    assert "completed" == status.state
    assert "chat.completion" == status.result["object"]
    assert {"j1": 1} == fleet.stats.executions
    summary = call.future.result()
    assert pytest.approx(summary["duration_s"] * 0.05) == status.cost_cents
    stored = await s3_blobs.get(result_key("modal-beta", nonce))
    assert status.result["id"].encode() in stored


def s3_blobs_url(blobs: S3Blobs) -> str:
    return str(blobs._client.meta.endpoint_url)


async def test_a_call_is_answered_by_a_new_process_from_its_call_id_alone(
    modal_sdk: ModuleType, reference_function: ModuleType, s3_blobs: S3Blobs
) -> None:
    first = runtime(modal_sdk, s3_blobs)
    submission = await first.submit(job(), "token")
    after_restart = runtime(modal_sdk, s3_blobs)

    status = await settled(after_restart, submission.call_id)

    assert "completed" == status.state
    assert status.cost_cents is not None  # billed from the duration the function reported


async def test_a_function_that_raises_fails_the_call_without_a_retry_in_place(
    modal_sdk: ModuleType, s3_blobs: S3Blobs
) -> None:
    app = modal_sdk.App("worker")

    @app.function()
    def broken(payload: dict[str, Any]) -> None:
        message = f"no GPU for {payload['slug']}"
        raise ValueError(message)

    modal_sdk.CLOUD.deploy(app, environment_name="beta")
    rt = runtime(modal_sdk, s3_blobs, function="broken")
    submission = await rt.submit(job(), "token")

    status = await settled(rt, submission.call_id)

    assert ("failed", "MODAL_CALL_FAILED", False, False) == (
        status.state, status.error_code, status.retryable, status.terminal,
    )  # fmt: skip
    assert "ValueError: no GPU for j1" in (status.message or "")


async def test_an_expired_output_is_completed_from_the_result_the_function_wrote(
    modal_sdk: ModuleType, reference_function: ModuleType, s3_blobs: S3Blobs
) -> None:
    rt = runtime(modal_sdk, s3_blobs)
    submission = await rt.submit(job(), "token")
    (call,) = modal_sdk.CLOUD.calls.values()
    await asyncio.wait_for(asyncio.wrap_future(call.future), 10)
    modal_sdk.CLOUD.expire(submission.call_id.split("+")[0])

    status = await rt.status(submission.call_id)

    assert "completed" == status.state
    assert "chat.completion" == status.result["object"]


async def test_an_expired_output_without_a_result_is_a_retryable_failure(
    modal_sdk: ModuleType, s3_blobs: S3Blobs
) -> None:
    app = modal_sdk.App("worker")

    @app.function()
    def forgetful(payload: dict[str, Any]) -> dict[str, Any]:
        return {"duration_s": 1.0, "slug": payload["slug"]}

    modal_sdk.CLOUD.deploy(app, environment_name="beta")
    rt = runtime(modal_sdk, s3_blobs, function="forgetful")
    returned = await rt.submit(job("a"), "token")
    expired = await rt.submit(job("b"), "token")
    for call in modal_sdk.CLOUD.calls.values():
        await asyncio.wait_for(asyncio.wrap_future(call.future), 10)
    modal_sdk.CLOUD.expire(expired.call_id.split("+")[0])

    assert ("failed", "MODAL_NO_RESULT", True) == summary(await rt.status(returned.call_id))
    assert ("failed", "MODAL_OUTPUT_EXPIRED", True) == summary(await rt.status(expired.call_id))


def summary(status: CallStatus) -> tuple[str, str | None, bool]:
    return status.state, status.error_code, status.retryable


async def test_cancel_cancels_the_modal_call(
    modal_sdk: ModuleType, reference_function: ModuleType, s3_blobs: S3Blobs
) -> None:
    modal_sdk.CLOUD.hold.clear()
    rt = runtime(modal_sdk, s3_blobs)
    submission = await rt.submit(job(), "token")

    await rt.cancel(submission.call_id)

    (call,) = modal_sdk.CLOUD.calls.values()
    assert call.cancelled
    status = await rt.status(submission.call_id)
    assert ("failed", "MODAL_CALL_FAILED") == (status.state, status.error_code)


async def test_a_refused_token_is_an_auth_failure_and_a_missing_function_a_rejection(
    modal_sdk: ModuleType, reference_function: ModuleType, s3_blobs: S3Blobs
) -> None:
    with pytest.raises(RuntimeAuthFailed, match="AuthError"):
        await runtime(modal_sdk, s3_blobs, token=("ak-x", "as-x")).submit(job(), "t")
    with pytest.raises(RuntimeRejected, match="NotFoundError"):
        await runtime(modal_sdk, s3_blobs, function="nope").submit(job(), "t")
    modal_sdk.CLOUD.unreachable = True
    with pytest.raises(RuntimeUnreachable, match="ConnectionError"):
        await runtime(modal_sdk, s3_blobs).submit(job(), "t")
    assert {} == modal_sdk.CLOUD.calls


async def test_without_presigned_urls_the_runtime_is_unreachable_and_spawns_nothing(
    modal_sdk: ModuleType, reference_function: ModuleType, tmp_path: Path
) -> None:
    with pytest.raises(RuntimeUnreachable, match="S3-compatible blob store"):
        await runtime(modal_sdk, LocalBlobs(tmp_path)).submit(job(), "t")
    assert {} == modal_sdk.CLOUD.calls
