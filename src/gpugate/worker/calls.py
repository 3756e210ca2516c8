"""A pushed call, how it ended, and the final report that tells the gateway (pure data).

A call is ``queued`` (accepted, not yet claimed), ``running`` (the gateway took the
``claimed``), then ``completed`` or ``failed``; its :class:`FinalReport` is what the worker owes
the gateway for it: ``PATCH /v1/jobs/{slug}`` with the result, or ``POST .../fail``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from gpugate.retry import retryable

CALL_STATES = ("queued", "running", "completed", "failed")
_OPERATION = re.compile(r"[A-Za-z0-9_-]+(?:/[A-Za-z0-9_-]+)*")
_MESSAGE_LIMIT = 500


class PushRejected(ValueError):
    """A push body the worker cannot run (a 400 to the gateway)."""


@dataclass(frozen=True, slots=True)
class Push:
    """A validated push body (``POST /calls``)."""

    slug: str
    model: str
    job_class: str
    operation: str
    input: dict[str, Any]
    lease_token: str
    deadline: datetime | None

    @classmethod
    def parse(cls, body: Any) -> Push:
        if not isinstance(body, dict):
            raise PushRejected("the body must be a JSON object")
        strings = {}
        for key in ("slug", "model", "operation", "lease_token"):
            value = body.get(key)
            if not isinstance(value, str) or not value:
                raise PushRejected(f"{key} must be a non-empty string")
            strings[key] = value
        if not _OPERATION.fullmatch(strings["operation"]):
            raise PushRejected(f"invalid operation {strings['operation']!r}")
        if not isinstance(body.get("input"), dict):
            raise PushRejected("input must be a JSON object")
        return cls(
            slug=strings["slug"],
            model=strings["model"],
            job_class=str(body.get("class") or "batch"),
            operation=strings["operation"],
            input=body["input"],
            lease_token=strings["lease_token"],
            deadline=_deadline(body.get("deadline")),
        )


@dataclass(frozen=True, slots=True)
class FinalReport:
    """What ends a call at the gateway: ``kind`` ``result`` (PATCH) or ``fail`` (POST .../fail),
    with its JSON ``body``. Kept on disk until the gateway has taken it."""

    call_id: str
    slug: str
    lease_token: str
    kind: str
    body: dict[str, Any]

    @property
    def state(self) -> str:
        return "completed" if self.kind == "result" else "failed"

    @property
    def path(self) -> str:
        """The gateway route that takes it."""
        return f"/v1/jobs/{self.slug}" if self.kind == "result" else f"/v1/jobs/{self.slug}/fail"

    @property
    def method(self) -> str:
        return "PATCH" if self.kind == "result" else "POST"

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "call_id": self.call_id,
                "slug": self.slug,
                "lease_token": self.lease_token,
                "kind": self.kind,
                "body": self.body,
            }
        ).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> FinalReport:
        data = json.loads(raw)
        if data.get("kind") not in ("result", "fail") or not isinstance(data.get("body"), dict):
            raise ValueError("not a final report")
        return cls(
            str(data["call_id"]),
            str(data["slug"]),
            str(data["lease_token"]),
            data["kind"],
            data["body"],
        )


def completed(call_id: str, push: Push, result: Any, duration_s: float) -> FinalReport:
    body = {"result": result, "duration_s": round(duration_s, 6)}
    return FinalReport(call_id, push.slug, push.lease_token, "result", body)


def failed(
    call_id: str, push: Push, error_code: str, message: str, *, retryable: bool
) -> FinalReport:
    body = {"error_code": error_code, "message": message[:_MESSAGE_LIMIT], "retryable": retryable}
    return FinalReport(call_id, push.slug, push.lease_token, "fail", body)


def answered(call_id: str, push: Push, status: int, body: bytes, duration_s: float) -> FinalReport:
    """The report for the model server's answer: 2xx completes (JSON, else the text); a status
    :func:`gpugate.retry.retryable` names (429, 500, 502, 503, 504) fails retryably (another
    runtime may do better); any other fails for good (the answer will not change)."""
    if 200 <= status < 300:
        return completed(call_id, push, _json_or_text(body), duration_s)
    message = (
        f"the model server answered {status}: {body[:_MESSAGE_LIMIT].decode(errors='replace')}"
    )
    return failed(call_id, push, f"UPSTREAM_{status}", message, retryable=retryable(status))


@dataclass(slots=True, eq=False)
class Call:
    """One call this worker holds: the job's slug and lease token, its state, and once
    finished its report (a call read back from the outbox after a restart has no push)."""

    call_id: str
    slug: str
    lease_token: str
    push: Push | None = None
    state: str = "queued"
    report: FinalReport | None = None
    delivered: bool = False

    @classmethod
    def finished(cls, report: FinalReport) -> Call:
        """A call known only by its report (read back from the outbox)."""
        return cls(
            report.call_id, report.slug, report.lease_token, state=report.state, report=report
        )

    def view(self) -> dict[str, Any]:
        """``GET /calls/{id}``: the state, and the outcome once there is one."""
        out: dict[str, Any] = {"call_id": self.call_id, "slug": self.slug, "state": self.state}
        if self.report is not None:
            out.update(self.report.body)
            out["delivered"] = self.delivered
        return out


def _deadline(value: Any) -> datetime | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise PushRejected("deadline must be an ISO 8601 time")
    try:
        moment = datetime.fromisoformat(value)
    except ValueError as exc:
        raise PushRejected(f"deadline must be an ISO 8601 time: {exc}") from exc
    if moment.utcoffset() is None:
        raise PushRejected("deadline must carry its time zone")
    return moment


def _json_or_text(body: bytes) -> Any:
    try:
        return json.loads(body)
    except ValueError:
        return body.decode("utf-8", errors="replace")
