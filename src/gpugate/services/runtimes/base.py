"""The Runtime interface: a place a job can run, as the dispatcher and the reaper use it.

A runtime takes a job as a *call* (:meth:`Runtime.submit` answers its ``call_id``), starts it
once the gateway has recorded the call (:meth:`Runtime.confirm`), answers for it when asked
(:meth:`Runtime.status`, the reaper's backstop) and drops it on request (:meth:`Runtime.cancel`).

``submit`` raises a :class:`~gpugate.errors.RuntimeFailure`: retryable (:class:`RuntimeBusy`,
:class:`RuntimeUnreachable`, :class:`RuntimeTimeout`) or not (:class:`RuntimeRejected`,
:class:`RuntimeAuthFailed`); or :class:`~gpugate.errors.GpuSaturated` when the shed gate refuses
batch work, which defers the job and never fails it. Implementations translate their own
transport's errors into these, once, where they enter.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Protocol

from gpugate.errors import (
    RuntimeAuthFailed,
    RuntimeBusy,
    RuntimeFailure,
    RuntimeRejected,
    RuntimeTimeout,
    RuntimeUnreachable,
)
from gpugate.store import JobRecord

__all__ = [
    "CALL_STATES",
    "CallState",
    "CallStatus",
    "Runtime",
    "RuntimeAuthFailed",
    "RuntimeBusy",
    "RuntimeFailure",
    "RuntimeRejected",
    "RuntimeTimeout",
    "RuntimeUnreachable",
    "Submission",
    "job_payload",
]

CallState = Literal["queued", "running", "completed", "failed", "unknown"]
CALL_STATES: tuple[CallState, ...] = ("queued", "running", "completed", "failed", "unknown")


@dataclass(frozen=True, slots=True)
class Submission:
    """A call the runtime accepted; ``running``: it runs from now (serverless, upstream) rather
    than from the worker's ``claimed`` (push)."""

    call_id: str
    running: bool


@dataclass(frozen=True, slots=True)
class CallStatus:
    """What a runtime knows of one call.

    ``unknown``: the runtime has no such call (it restarted, or never had it) — the reaper then
    takes the job back. With ``completed``: ``result`` (and ``cost_cents`` when reported). With
    ``failed``: ``error_code``/``message``; ``retryable`` says whether another attempt may help,
    ``terminal`` that the job itself is at fault (e.g. the model server answered 400) and no
    runtime will do better.
    """

    state: CallState
    result: Any = None
    cost_cents: float | None = None
    error_code: str | None = None
    message: str | None = None
    retryable: bool = True
    terminal: bool = False


class Runtime(Protocol):
    """One runtime of ``runtimes[]``, built by the composition root."""

    @property
    def id(self) -> str:
        """The runtime's id (``runtimes[].id``)."""
        ...

    @property
    def kind(self) -> str:
        """``upstream``, ``push`` or ``modal``."""
        ...

    @property
    def call_lease_s(self) -> float | None:
        """How long a call's lease lasts before the reaper asks the runtime about it; None:
        ``jobs.quiet_s``. A runtime whose calls complete only through that poll (Modal) asks
        sooner."""
        ...

    async def submit(self, job: JobRecord, lease_token: str) -> Submission:
        """Hand ``job`` over; ``lease_token`` fences every write made for this call."""
        ...

    async def confirm(self, call_id: str) -> None:
        """The gateway recorded the call (``leased_by = <runtime>:<call_id>``).

        A runtime that holds the work until then starts it now, so nothing runs for a submit the
        gateway could not record; one whose calls start at submit does nothing.
        """
        ...

    async def status(self, call_id: str) -> CallStatus:
        """The call's state; may raise a retryable :class:`RuntimeFailure` when it cannot tell."""
        ...

    async def cancel(self, call_id: str) -> None:
        """Stop the call if it still runs; harmless for an unknown or finished call."""
        ...

    async def close(self) -> None:
        """Stop every call this process runs itself (at shutdown)."""
        ...


def job_payload(runtime_id: str, job: JobRecord, runner: str) -> dict[str, Any]:
    """The job as a remote runtime receives it (DESIGN §3 push protocol: ``slug``, ``model``,
    ``class``, ``operation``, ``input``); :class:`RuntimeRejected` when its input is held in a
    blob, which ``runner`` (who runs it) cannot read."""
    if job.input_ref is not None:
        raise RuntimeRejected(
            f"{runtime_id}: the job's input is held in a blob ({job.input_ref}); "
            f"{runner} needs it inline"
        )
    return {
        "slug": job.slug,
        "model": job.model,
        "class": job.job_class,
        "operation": job.operation,
        "input": job.input,
    }
