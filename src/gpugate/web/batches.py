"""The OpenAI Batch API: ``/v1/files`` and ``/v1/batches`` in OpenAI's shapes, so the ``openai``
client's ``files.create``, ``files.retrieve``, ``files.content``, ``batches.create``,
``batches.retrieve`` and ``batches.cancel`` work against the gateway."""

from __future__ import annotations

from functools import partial

from starlette.datastructures import UploadFile
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Message, Receive

from gpugate.errors import (
    BadRequest,
    BatchNotFound,
    FileNotFound,
    GpugateError,
    ModelNotAllowed,
    PayloadTooLarge,
)
from gpugate.services.batches import Batches, batch_view, file_view, parse_lines
from gpugate.web.api import operation, route
from gpugate.web.auth import check_owned, principal_of, record_owned
from gpugate.web.bodies import refuse_declared_over
from gpugate.web.errors import error_body, status_of
from gpugate.web.schemas.batches import (
    BatchCreate,
    BatchPath,
    BatchView,
    FilePath,
    FileUpload,
    FileView,
)
from gpugate.web.schemas.operation import Answer, RawBody, Security
from gpugate.wiring import Gateway

TAGS = ("batches",)
client = partial(operation, Security.CLIENT, tags=TAGS)  # every operation here
FILE_NOT_FOUND = {404: "FILE_NOT_FOUND"}
BATCH_NOT_FOUND = {404: "BATCH_NOT_FOUND"}
A_FILE = {200: Answer("the file object", FileView)}
A_BATCH = {200: Answer("the batch object", BatchView)}


def _batches(gateway: Gateway) -> Batches:
    return gateway.batches


def present(exc: GpugateError) -> tuple[int, bytes]:
    """A gateway error as the HTTP answer a batch line records."""
    return status_of(exc), error_body(exc)


@client(
    responses=A_FILE,
    raw_body=RawBody({"multipart/form-data": FileUpload}),
)
async def create_file(request: Request, gateway: Gateway) -> FileView:
    """Upload a file (multipart `file`, `purpose` batch), as OpenAI's files.create."""
    limit = gateway.config.server.max_body_bytes
    refuse_declared_over(request, limit)
    # The form parser spools a file part to disk as it comes: count the body as it arrives and
    # stop at the limit, instead of refusing a 30 MiB upload after it was spooled whole.
    request = Request(request.scope, _bounded(request.receive, limit))
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
    record = await _batches(gateway).create_file(name, purpose, data)
    await record_owned(request, gateway, "file", record.id)
    return FileView.of(file_view(record))


def _bounded(receive: Receive, limit: int) -> Receive:
    """``receive`` that raises :class:`PayloadTooLarge` once the body passes ``limit`` bytes."""
    seen = 0

    async def bounded() -> Message:
        nonlocal seen
        message = await receive()
        seen += len(message.get("body", b""))
        if seen > limit:
            raise PayloadTooLarge(f"upload exceeds max_body_bytes ({limit})")
        return message

    return bounded


@client(responses=A_FILE, errors=FILE_NOT_FOUND)
async def get_file(request: Request, gateway: Gateway, path: FilePath) -> FileView:
    """A file object, as OpenAI's files.retrieve."""
    await check_owned(request, gateway, "file", path.file_id, _no_file(path.file_id))
    return FileView.of(file_view(await _batches(gateway).get_file(path.file_id)))


@client(
    responses={
        200: Answer(
            "the bytes",
            media="application/octet-stream",
            schema={"description": "the file's bytes (JSONL)"},
        )
    },
    errors=FILE_NOT_FOUND,
)
async def file_content(request: Request, gateway: Gateway, path: FilePath) -> Response:
    """A file's content (batch input or output JSONL), as OpenAI's files.content."""
    await check_owned(request, gateway, "file", path.file_id, _no_file(path.file_id))
    data = await _batches(gateway).file_content(path.file_id)
    return Response(data, media_type="application/octet-stream")


@client(
    responses={200: Answer("the batch object, in_progress", BatchView)},
    errors={
        400: "BAD_REQUEST: the body, or the first bad line of the input (nothing is stored)",
        **FILE_NOT_FOUND,
    },
)
async def create_batch(request: Request, gateway: Gateway, body: BatchCreate) -> BatchView:
    """Create a batch over an uploaded file or lines given inline, as OpenAI's batches.create.

    Every line is checked first (a 400 names the first bad one, nothing is stored); then each
    line runs through the gateway's proxy as class batch, with bounded concurrency.
    """
    if body.input_file_id is not None:
        await check_owned(
            request, gateway, "file", body.input_file_id, _no_file(body.input_file_id)
        )
    await _check_line_models(request, gateway, body)
    batch = await _batches(gateway).create_batch(body.service_body())
    await record_owned(request, gateway, "batch", batch.id)
    await record_owned(request, gateway, "file", batch.input_file_id)
    return BatchView.of(batch_view(batch))


@client(responses=A_BATCH, errors=BATCH_NOT_FOUND)
async def get_batch(request: Request, gateway: Gateway, path: BatchPath) -> BatchView:
    """A batch with `request_counts {total, completed, failed}`, as OpenAI's batches.retrieve."""
    await check_owned(request, gateway, "batch", path.batch_id, _no_batch(path.batch_id))
    batch = await _batches(gateway).get_batch(path.batch_id)
    # its output files are the batch owner's: they become readable through it
    await record_owned(request, gateway, "file", batch.output_file_id, batch.error_file_id)
    return BatchView.of(batch_view(batch))


@client(responses=A_BATCH, errors=BATCH_NOT_FOUND)
async def cancel_batch(request: Request, gateway: Gateway, path: BatchPath) -> BatchView:
    """Cancel a batch: in_progress → cancelling → cancelled, with the lines that finished."""
    await check_owned(request, gateway, "batch", path.batch_id, _no_batch(path.batch_id))
    return BatchView.of(batch_view(await _batches(gateway).cancel_batch(path.batch_id)))


async def _check_line_models(request: Request, gateway: Gateway, body: BatchCreate) -> None:
    """403 MODEL_NOT_ALLOWED when a line names a model the client key may not use (the lines
    run through the proxy, past the data plane's own check); a bad line of a file is the 400
    the batch would be refused with."""
    principal = principal_of(request)
    if principal is None or principal.key.models is None:
        return
    if body.input is not None:
        bodies = [line.body for line in body.input]
    else:
        assert body.input_file_id is not None  # BatchCreate holds one or the other
        raw = await _batches(gateway).file_content(body.input_file_id)
        bodies = [line.body for line in parse_lines(raw, body.endpoint)]
    for line_body in bodies:
        model = line_body.get("model")
        if isinstance(model, str) and not principal.key.may_use_model(model):
            raise ModelNotAllowed(f"client key {principal.key.prefix}… may not use {model!r}")


def _no_file(file_id: str) -> FileNotFound:
    return FileNotFound(f"no file {file_id!r}")


def _no_batch(batch_id: str) -> BatchNotFound:
    return BatchNotFound(f"no batch {batch_id!r}")


routes = [
    route("/v1/files", create_file, "POST"),
    route("/v1/files/{file_id}", get_file, "GET"),
    route("/v1/files/{file_id}/content", file_content, "GET"),
    route("/v1/batches", create_batch, "POST"),
    route("/v1/batches/{batch_id}", get_batch, "GET"),
    route("/v1/batches/{batch_id}/cancel", cancel_batch, "POST"),
]
