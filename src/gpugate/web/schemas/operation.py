"""An HTTP operation as data: who may call it, what it reads, what it answers.

:func:`gpugate.web.api.operation` builds a :class:`Spec` from a handler's signature and enforces
it; routes served outside Starlette (the data plane) or by modules that declare no spec yet
list theirs as :class:`Operation` tables. :mod:`gpugate.web.openapi` renders every one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import JsonSchemaMode


class Security(StrEnum):
    """Who may call an operation."""

    NONE = "none"  # anyone
    CLIENT = "client"  # the data plane and jobs: anyone with auth.mode open, a client key with keys
    ADMIN = "admin"  # Authorization: Bearer <admin token>
    WORKER = "worker"  # Authorization: Bearer <secret of the runtime holding the lease>
    CONSOLE = "console"  # the console's session cookie (and its CSRF token on every POST)


@dataclass(frozen=True, slots=True)
class Answer:
    """One documented response: a JSON body of ``model``, or ``media`` with ``schema``.

    ``mode``: the model's schema as it serializes (views), or as it validates — for a body
    that is a document the client could send back (the config export).
    """

    description: str
    model: type[BaseModel] | None = None
    media: str = "application/json"
    schema: Mapping[str, Any] | None = None
    headers: Mapping[str, str] = field(default_factory=dict)  # name -> description
    mode: JsonSchemaMode = "serialization"
    alternatives: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # media -> schema


@dataclass(frozen=True, slots=True)
class RawBody:
    """A request body that is not one JSON model: its media types and their schemas."""

    media: Mapping[str, Mapping[str, Any] | type[BaseModel]]
    required: bool = True
    description: str = ""


@dataclass(frozen=True, slots=True)
class Spec:
    """What an operation reads and answers, whatever serves it.

    ``errors``: the error statuses it may answer and with which codes, beyond those every
    operation of its kind may (400 for bad input, 401 when secured, 413 with a body, 503 with
    ``Retry-After`` when the store is unavailable): see :func:`default_errors`; each in the
    ``error_media`` (the console's errors are pages). ``default``: the answer for any status not
    listed — a pass-through relays its upstream's, whatever it is.
    """

    summary: str
    description: str = ""
    security: Security = Security.NONE
    tags: tuple[str, ...] = ()
    responses: Mapping[int, Answer] = field(default_factory=dict)
    errors: Mapping[int, str] = field(default_factory=dict)
    body: type[BaseModel] | RawBody | None = None
    body_required: bool = True
    query: type[BaseModel] | None = None
    path: type[BaseModel] | None = None
    headers: type[BaseModel] | None = None
    uses_store: bool = True
    error_media: tuple[str, ...] = ("application/json",)
    default: Answer | None = None

    def all_errors(self) -> dict[int, str]:
        """Every error status with its codes: the defaults of its kind, then its own."""
        return {**default_errors(self), **self.errors}


@dataclass(frozen=True, slots=True)
class Operation:
    """A :class:`Spec` at its place: ``method`` and ``path`` as OpenAPI writes them."""

    method: str
    path: str
    spec: Spec


def default_errors(spec: Spec) -> dict[int, str]:
    """The error answers an operation of ``spec``'s kind may give, whatever it does."""
    errors: dict[int, str] = {}
    if any(part is not None for part in (spec.body, spec.query, spec.path, spec.headers)):
        errors[400] = "BAD_REQUEST: a parameter or the body is not what this operation takes"
    if spec.security in (Security.ADMIN, Security.WORKER):
        errors[401] = "UNAUTHORIZED: no credential, or not the right one"
    if spec.security is Security.CLIENT:
        errors[401] = "UNAUTHORIZED: auth.mode keys, and no client key or not a valid one"
    if spec.security is Security.ADMIN:
        errors[429] = "TOO_MANY_ATTEMPTS: too many wrong tokens from this client (Retry-After)"
    if spec.body is not None:
        errors[413] = "PAYLOAD_TOO_LARGE: the body is over server.max_body_bytes"
    if spec.uses_store:
        errors[503] = "STORE_ERROR: the store is unavailable (Retry-After)"
    return errors
