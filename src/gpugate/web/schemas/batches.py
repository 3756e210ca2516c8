"""The OpenAI Batch API's bodies: files and batches in OpenAI's shapes (issue 9)."""

from __future__ import annotations

from typing import Any, Literal, Self

from pydantic import Field, model_validator

from gpugate.services.batches import ENDPOINTS, PURPOSES, WINDOWS
from gpugate.web.schemas.common import Key, Query, RequestBody, View

Endpoint = Literal[ENDPOINTS]  # type: ignore[valid-type]
Purpose = Literal[PURPOSES]  # type: ignore[valid-type]


class BatchLine(RequestBody):
    """One request of a batch, as a line of its JSONL input file."""

    custom_id: str = Field(min_length=1, description="unique within the batch")
    method: Literal["POST"]
    url: Endpoint = Field(description="the batch's endpoint")
    body: dict[str, Any] = Field(description="the request body, with a `model`")


class BatchCreate(RequestBody):
    """A batch over an uploaded file (``input_file_id``) or over lines given inline (``input``,
    a gpugate extension; the ``openai`` client sends it with ``extra_body``)."""

    input_file_id: Key | None = None
    input: list[BatchLine] | None = Field(
        None, min_length=1, description="the lines themselves, instead of a file"
    )
    endpoint: Endpoint
    completion_window: str = Field("24h", json_schema_extra={"enum": list(WINDOWS)})
    metadata: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _one_input(self) -> Self:
        if self.input is not None and self.input_file_id is not None:
            raise ValueError("give input_file_id or input (the lines inline), not both")
        if self.input is None and self.input_file_id is None:
            raise ValueError("give input_file_id (a file id) or input (the lines inline)")
        return self

    def service_body(self) -> dict[str, Any]:
        """The body as the batches service reads it: the keys the client sent."""
        return self.model_dump(exclude_unset=True)


class FileUpload(RequestBody):
    """``multipart/form-data``, as OpenAI's ``files.create`` sends it."""

    file: bytes = Field(json_schema_extra={"format": "binary"}, description="JSONL lines")
    purpose: Purpose


class FilePath(Query):
    file_id: Key


class BatchPath(Query):
    batch_id: Key


class FileView(View):
    id: str
    object: Literal["file"]
    bytes: int
    created_at: int | None
    filename: str
    purpose: str
    status: str
    status_details: str | None
    expires_at: int | None


class RequestCounts(View):
    total: int
    completed: int
    failed: int


class BatchView(View):
    """A batch as OpenAI shows one; times are Unix seconds."""

    id: str
    object: Literal["batch"]
    endpoint: str
    errors: Any
    input_file_id: str
    completion_window: str
    status: Literal[
        "validating",
        "failed",
        "in_progress",
        "finalizing",
        "completed",
        "expired",
        "cancelling",
        "cancelled",
    ]
    output_file_id: str | None
    error_file_id: str | None
    created_at: int | None
    in_progress_at: int | None
    expires_at: int | None
    finalizing_at: int | None
    completed_at: int | None
    failed_at: int | None
    expired_at: int | None
    cancelling_at: int | None
    cancelled_at: int | None
    request_counts: RequestCounts
    metadata: dict[str, Any] | None
