"""The OpenAI Batch API: ``/v1/files`` and ``/v1/batches`` in OpenAI's shapes, so the ``openai``
client's ``files.create``, ``files.retrieve``, ``files.content``, ``batches.create``,
``batches.retrieve`` and ``batches.cancel`` work against the gateway."""

from __future__ import annotations

from starlette.datastructures import UploadFile
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gpugate.errors import BadRequest, GpugateError, PayloadTooLarge
from gpugate.services.batches import Batches, batch_view, file_view
from gpugate.web.bodies import json_body, refuse_declared_over
from gpugate.web.errors import error_body, status_of
from gpugate.wiring import Gateway


def _batches(request: Request) -> Batches:
    gateway: Gateway = request.app.state.gateway
    assert gateway.batches is not None
    return gateway.batches


def present(exc: GpugateError) -> tuple[int, bytes]:
    """A gateway error as the HTTP answer a batch line records."""
    return status_of(exc), error_body(exc)


async def create_file(request: Request) -> Response:
    """Upload a JSONL file of batch requests.
    ---
    summary: Upload a file (multipart `file`, `purpose` batch), as OpenAI's files.create
    responses:
      200: {description: the file object}
      400: {description: BAD_REQUEST}
      413: {description: PAYLOAD_TOO_LARGE}
    """
    gateway: Gateway = request.app.state.gateway
    limit = gateway.config.server.max_body_bytes
    refuse_declared_over(request, limit)
    async with request.form(max_part_size=limit) as form:
        upload, purpose = form.get("file"), form.get("purpose")
        if not isinstance(upload, UploadFile) or not isinstance(purpose, str):
            raise BadRequest("expected a multipart form with `file` and `purpose`")
        # ``max_part_size`` bounds only the non-file fields, and a chunked body declares no
        # length: the file itself is checked here.
        data = await upload.read(limit + 1)
        if len(data) > limit:
            raise PayloadTooLarge(f"upload exceeds max_body_bytes ({limit})")
        name = upload.filename or "upload.jsonl"
    record = await _batches(request).create_file(name, purpose, data)
    return JSONResponse(file_view(record))


async def get_file(request: Request) -> Response:
    """A file's metadata.
    ---
    summary: A file object, as OpenAI's files.retrieve
    responses:
      200: {description: the file object}
      404: {description: FILE_NOT_FOUND}
    """
    record = await _batches(request).get_file(request.path_params["file_id"])
    return JSONResponse(file_view(record))


async def file_content(request: Request) -> Response:
    """A file's bytes.
    ---
    summary: A file's content (batch input or output JSONL), as OpenAI's files.content
    responses:
      200: {description: the bytes}
      404: {description: FILE_NOT_FOUND}
    """
    data = await _batches(request).file_content(request.path_params["file_id"])
    return Response(data, media_type="application/octet-stream")


async def create_batch(request: Request) -> Response:
    """Start a batch over an uploaded file.
    ---
    summary: Create a batch (`input_file_id`, `endpoint`, `completion_window` 24h, `metadata`)
    description: >-
      Every line is checked first (a 400 names the first bad one, nothing is stored); then each
      line runs through the gateway's proxy as class batch, with bounded concurrency.
    responses:
      200: {description: the batch object, in_progress}
      400: {description: BAD_REQUEST}
      404: {description: FILE_NOT_FOUND}
    """
    batch = await _batches(request).create_batch(await json_body(request))
    return JSONResponse(batch_view(batch))


async def get_batch(request: Request) -> Response:
    """A batch and its progress.
    ---
    summary: A batch object with `request_counts {total, completed, failed}`
    responses:
      200: {description: the batch object}
      404: {description: BATCH_NOT_FOUND}
    """
    batch = await _batches(request).get_batch(request.path_params["batch_id"])
    return JSONResponse(batch_view(batch))


async def cancel_batch(request: Request) -> Response:
    """Cancel a batch: no more of its lines start.
    ---
    summary: Cancel a batch (in_progress -> cancelling -> cancelled, with the finished lines)
    responses:
      200: {description: the batch object}
      404: {description: BATCH_NOT_FOUND}
    """
    batch = await _batches(request).cancel_batch(request.path_params["batch_id"])
    return JSONResponse(batch_view(batch))


routes = [
    Route("/v1/files", create_file, methods=["POST"]),
    Route("/v1/files/{file_id}", get_file, methods=["GET"]),
    Route("/v1/files/{file_id}/content", file_content, methods=["GET"]),
    Route("/v1/batches", create_batch, methods=["POST"]),
    Route("/v1/batches/{batch_id}", get_batch, methods=["GET"]),
    Route("/v1/batches/{batch_id}/cancel", cancel_batch, methods=["POST"]),
]
