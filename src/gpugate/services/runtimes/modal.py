"""The ``modal`` runtime: a job as one call of a deployed Modal function (serverless GPU).

:meth:`ModalRuntime.submit` presigns a PUT URL for the result in the blob store (S3-compatible:
Modal's cloud must reach it) and spawns the function with the payload

    {"slug", "model", "class", "operation", "input", "result_put_url", "result_key", "deadline"}

The function runs the job, PUTs the result (JSON) to ``result_put_url`` and returns a small
summary, ``{"duration_s": ...}`` (``examples/modal_function.py`` is the reference). The call is
``running`` from the spawn. Nothing calls back: the reaper's poll (:meth:`status`, every
``poll_s``) is the only completion path —

* pending → ``running``; returned → ``completed`` with the result read from the blob store and
  its cost, the reported ``duration_s`` (else the time since the spawn) times ``cents_per_second``;
* the function raised → ``failed`` (``MODAL_CALL_FAILED``, not retryable here: the walk goes on);
* output expired → the result is looked for in the blob store (the function wrote it there
  before returning); without it ``failed`` (``MODAL_OUTPUT_EXPIRED``, retryable);
* returned without a result blob → ``failed`` (``MODAL_NO_RESULT``, retryable).

The call id the gateway records is ``<modal call id>+<result nonce>``: after a restart the poll
still knows where the result goes.
"""

from __future__ import annotations

import logging
import secrets
from datetime import timedelta
from typing import Any

from gpugate.adapters.blobs import BlobStore
from gpugate.adapters.modal_calls import (
    CallFailed,
    CallOutputExpired,
    CallPending,
    ModalCalls,
)
from gpugate.clock import Clock
from gpugate.errors import BlobError, BlobNotFound, RuntimeRejected, RuntimeUnreachable
from gpugate.services.proxy import json_or_text
from gpugate.services.runtimes.base import CallStatus, Submission, job_payload
from gpugate.store import JobRecord

log = logging.getLogger("gpugate.runtimes.modal")

CALL_FAILED = "MODAL_CALL_FAILED"
OUTPUT_EXPIRED = "MODAL_OUTPUT_EXPIRED"
NO_RESULT = "MODAL_NO_RESULT"
_SEPARATOR = "+"
_JSON = "application/json"


def result_key(runtime_id: str, nonce: str) -> str:
    """Where a call's result goes in the blob store."""
    return f"results/{runtime_id}/{nonce}.json"


class ModalRuntime:
    """Runs jobs as calls of one Modal function; see the module docstring."""

    kind = "modal"

    def __init__(  # noqa: PLR0913 - collaborators, then keyword-only knobs
        self,
        runtime_id: str,
        calls: ModalCalls,
        blobs: BlobStore,
        clock: Clock,
        *,
        cents_per_second: float = 0.0,
        presign_s: float = 3600.0,
        timeout_s: float = 3600.0,
        poll_s: float = 15.0,
    ) -> None:
        self._id = runtime_id
        self._calls = calls
        self._blobs = blobs
        self._clock = clock
        self._cents_per_second = cents_per_second
        self._presign_s = presign_s
        self._timeout_s = timeout_s
        #: How often the reaper polls a call of this runtime: the lease a call is given.
        self.call_lease_s: float | None = poll_s
        self._spawned_at: dict[str, float] = {}  # call id → monotonic time of the spawn

    @property
    def id(self) -> str:
        return self._id

    async def submit(self, job: JobRecord, lease_token: str) -> Submission:  # noqa: ARG002
        common = job_payload(self._id, job, "a Modal function")
        if not self._blobs.presigns:
            raise RuntimeUnreachable(
                f"{self._id}: Modal writes results through presigned URLs; "
                "configure an S3-compatible blob store (blobs: {kind: s3, ...})"
            )
        nonce = secrets.token_hex(8)
        key = result_key(self._id, nonce)
        payload = {
            **common,
            "result_put_url": await self._blobs.presign_put(
                key, expires_s=self._presign_s, content_type=_JSON
            ),
            "result_key": key,
            "deadline": (self._clock.now() + timedelta(seconds=self._timeout_s)).isoformat(),
        }
        modal_id = await self._calls.spawn(payload)
        call_id = f"{modal_id}{_SEPARATOR}{nonce}"
        self._spawned_at[call_id] = self._clock.monotonic()
        return Submission(call_id, running=True)

    async def confirm(self, call_id: str) -> None:
        """Nothing: a Modal call runs from its spawn."""

    async def status(self, call_id: str) -> CallStatus:
        modal_id, nonce = _split(call_id)
        key = result_key(self._id, nonce)
        try:
            summary = await self._calls.poll(modal_id)
        except CallPending:
            return CallStatus("running")
        except CallFailed as exc:
            self._spawned_at.pop(call_id, None)
            message = f"the Modal function raised {exc.kind}: {exc.message}"
            return CallStatus("failed", error_code=CALL_FAILED, message=message, retryable=False)
        except CallOutputExpired:
            summary = None
            log.info("%s: call %s output expired; looking for its result", self._id, modal_id)
        return await self._completed(call_id, key, summary)

    async def cancel(self, call_id: str) -> None:
        self._spawned_at.pop(call_id, None)
        await self._calls.cancel(_split(call_id)[0])

    async def close(self) -> None:
        """Nothing runs here: the calls run (and are polled) in Modal's cloud."""

    async def _completed(self, call_id: str, key: str, summary: Any) -> CallStatus:
        try:
            body = await self._blobs.get(key)
        except BlobNotFound:
            code, why = (
                (OUTPUT_EXPIRED, "its output expired")
                if summary is None
                else (NO_RESULT, "it returned")
            )
            message = f"{why} without writing a result to {key}"
            return CallStatus("failed", error_code=code, message=message, retryable=True)
        except BlobError as exc:
            raise RuntimeUnreachable(f"{self._id}: {exc.message}") from exc
        return CallStatus(
            "completed", result=json_or_text(body), cost_cents=self._cost(call_id, summary)
        )

    def _cost(self, call_id: str, summary: Any) -> float | None:
        spawned = self._spawned_at.pop(call_id, None)
        reported = summary.get("duration_s") if isinstance(summary, dict) else None
        if isinstance(reported, int | float) and reported >= 0:
            seconds = float(reported)
        elif spawned is not None:
            seconds = self._clock.monotonic() - spawned
        else:
            return None  # spawned by an earlier process, and no duration reported
        return round(seconds * self._cents_per_second, 6)

    def __repr__(self) -> str:
        return f"<ModalRuntime {self._id} {self._calls.target}>"


def _split(call_id: str) -> tuple[str, str]:
    modal_id, separator, nonce = call_id.rpartition(_SEPARATOR)
    if not separator or not modal_id or not nonce:
        raise RuntimeRejected(f"not a call id of a modal runtime: {call_id!r}")
    return modal_id, nonce
