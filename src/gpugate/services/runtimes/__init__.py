"""The places a job can run, behind one interface (:class:`Runtime`).

``upstream`` (:class:`UpstreamRuntime`) forwards through the gateway's own sync path; ``push``
and ``modal`` implement the same interface in their own modules.
"""

from gpugate.services.runtimes.base import (
    CALL_STATES,
    CallState,
    CallStatus,
    Runtime,
    RuntimeAuthFailed,
    RuntimeBusy,
    RuntimeFailure,
    RuntimeRejected,
    RuntimeTimeout,
    RuntimeUnreachable,
    Submission,
)
from gpugate.services.runtimes.upstream import UpstreamRuntime

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
    "UpstreamRuntime",
]
