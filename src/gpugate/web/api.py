"""The JSON API's operations, each declared once and held to its declaration.

    @operation(Security.ADMIN, responses={200: Answer("the runtime", RuntimeView)})
    async def get_runtime(gateway: Gateway, path: RuntimePath) -> RuntimeView:
        '''One runtime in detail (the first line is the summary; the rest, the description).'''

    routes = [route("/admin/runtimes/{runtime}", get_runtime, "GET")]

The handler's parameters say what it reads: ``path``, ``query``, ``headers`` and ``body``,
annotated with pydantic models, are validated from the request before it runs (a 400
``BAD_REQUEST`` naming every key path: ``input.messages[0].role: ...``); ``request`` and
``gateway`` are handed over as they are, and a worker route's ``caller`` (:class:`Caller`: the
push runtimes that sent it). The security is checked first. A handler answers a
:class:`~gpugate.web.schemas.common.View` (200, JSON) or any Starlette ``Response``. The same
:class:`~gpugate.web.schemas.operation.Spec` is what ``GET /openapi.json`` says of the route, so
the document cannot drift from what the route enforces.

A worker route (``Security.WORKER``) is authenticated over its whole body, read once: the
``X-Gpugate-Signature`` of a push runtime (or a ``push.auth: bearer`` runtime's secret, see
:class:`~gpugate.core.push_keys.PushKeys`); the answer to a signed request — its errors too — is
signed for that request.
"""

from __future__ import annotations

import hmac
import inspect
import math
import time
import typing
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Message, Receive

from gpugate.core.throttle import client_key
from gpugate.errors import BadRequest, GpugateError, TooManyAttempts, Unauthorized
from gpugate.push_signature import HEADER as SIGNATURE_HEADER
from gpugate.web.auth import authorize_client
from gpugate.web.bodies import json_body, read_body
from gpugate.web.errors import error_response
from gpugate.web.schemas.common import View, validation_message
from gpugate.web.schemas.operation import Answer, RawBody, Security, Spec
from gpugate.wiring import Gateway

Handler = Callable[..., Awaitable[Response | View]]
_PARTS = ("path", "query", "headers", "body")
_GIVEN = ("request", "gateway", "caller")
LEASE_HEADER = "x-lease-token"


@dataclass(frozen=True, slots=True)
class Caller:
    """Who sent a worker route's request: the push runtimes whose key (or secret) it carries,
    and the nonce its answer is signed for (``None``: a bearer request, answered unsigned)."""

    runtimes: frozenset[str]
    nonce: str | None


def token_matches(offered: str, token: str) -> bool:
    """Whether ``offered`` is the admin ``token``, compared in constant time."""
    return hmac.compare_digest(offered.encode(), token.encode())


def throttled_match(request: Request, gateway: Gateway, offered: str, token: str) -> bool:
    """Whether ``offered`` is the admin ``token``; :class:`TooManyAttempts` first when this
    client has offered wrong ones too often (issue #15 finding 8: no brute force of the token
    through the console or the admin API)."""
    throttle = gateway.login_throttle
    key = client_key(request.client.host if request.client is not None else None)
    now = gateway.clock.monotonic()
    wait = throttle.retry_after(key, now)
    if wait is not None:
        raise TooManyAttempts(
            f"too many wrong admin tokens from this address; try again in {math.ceil(wait)} s",
            retry_after_s=wait,
        )
    if token_matches(offered, token):
        throttle.succeeded(key)
        return True
    throttle.failed(key, now)
    return False


def authorize_admin(request: Request, gateway: Gateway) -> None:
    """:class:`Unauthorized` unless the request carries ``Authorization: Bearer <admin token>``;
    without an admin token configured the admin API refuses everything."""
    token = gateway.admin_token
    if token is None:
        raise Unauthorized(
            "the admin API is disabled: no admin token is configured (admin_token_env)"
        )
    scheme, _, offered = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not offered:
        raise Unauthorized("missing or wrong admin token")
    if not throttled_match(request, gateway, offered, token):
        raise Unauthorized("missing or wrong admin token")


def validated(model: type[BaseModel], data: Any) -> BaseModel:
    """``data`` as ``model``, or :class:`BadRequest` naming every key path that is wrong."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise BadRequest(validation_message(exc, data, model)) from exc


def header_values(model: type[BaseModel], request: Request) -> dict[str, str]:
    """The request headers ``model`` reads, under its field aliases (the header names)."""
    values = {}
    for name, info in model.model_fields.items():
        header = info.alias or name
        if (value := request.headers.get(header)) is not None:
            values[header] = value
    return values


class Endpoint:
    """A handler with its :class:`Spec`; :meth:`handle` is what Starlette calls."""

    def __init__(self, handler: Handler, spec: Spec, parts: Mapping[str, type[BaseModel]]) -> None:
        self.handler = handler
        self.spec = spec
        self._parts = parts
        self._given = [name for name in _GIVEN if name in inspect.signature(handler).parameters]
        self.__name__ = handler.__name__

    async def handle(self, request: Request) -> Response:
        gateway: Gateway = request.app.state.gateway
        if self.spec.security is Security.ADMIN:
            authorize_admin(request, gateway)
        elif self.spec.security is Security.CLIENT:
            await authorize_client(request, gateway)
        elif self.spec.security is Security.WORKER:
            return await self._as_worker(request, gateway)
        return await self._answer(request, gateway, None)

    async def _as_worker(self, request: Request, gateway: Gateway) -> Response:
        """Authenticate the push runtime over the whole body, then answer; sign the answer to
        a signed request (errors included)."""
        raw = await read_body(request, gateway.config.server.max_body_bytes)
        target = request.scope.get("raw_path", request.url.path.encode()).decode("latin-1")
        query = request.scope.get("query_string", b"")
        runtimes, nonce = gateway.push_keys.authenticate(
            request.headers.get(SIGNATURE_HEADER),
            request.headers.get("authorization"),
            method=request.method,
            target=target + (f"?{query.decode('latin-1')}" if query else ""),
            body=raw,
            lease_token=request.headers.get(LEASE_HEADER),
            now=time.time(),
        )
        replayed = Request(request.scope, _replay(raw))
        try:
            answer = await self._answer(replayed, gateway, Caller(runtimes, nonce))
        except GpugateError as exc:
            if nonce is None:
                raise
            answer = error_response(exc)
        if nonce is not None:
            answer.headers[SIGNATURE_HEADER] = gateway.push_keys.sign_answer(
                runtimes, nonce, answer.status_code, bytes(answer.body)
            )
        return answer

    async def _answer(self, request: Request, gateway: Gateway, caller: Caller | None) -> Response:
        given = {"request": request, "gateway": gateway, "caller": caller}
        kwargs: dict[str, Any] = {name: given[name] for name in self._given}
        for part, model in self._parts.items():
            kwargs[part] = validated(model, await self._raw(part, request))
        answer = await self.handler(**kwargs)
        if isinstance(answer, Response):
            return answer
        return Response(answer.to_bytes(), media_type="application/json")

    async def _raw(self, part: str, request: Request) -> Any:
        if part == "path":
            return dict(request.path_params)
        if part == "query":
            return dict(request.query_params)
        if part == "headers":
            return header_values(self._parts["headers"], request)
        return await json_body(request, empty_ok=not self.spec.body_required)

    def __repr__(self) -> str:
        return f"<Endpoint {self.__name__} security={self.spec.security}>"


def _replay(raw: bytes) -> Receive:
    """A ``receive`` that hands over ``raw`` once: the body, read whole before authentication,
    for the request's parts to be read from as on any route."""
    sent = False

    async def receive() -> Message:
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": raw, "more_body": False}

    return receive


def operation(
    security: Security,
    *,
    responses: Mapping[int, Answer],
    errors: Mapping[int, str] | None = None,
    tags: tuple[str, ...] = (),
    body_required: bool = True,
    raw_body: RawBody | None = None,
    uses_store: bool = True,
) -> Callable[[Handler], Endpoint]:
    """Declare an operation (see the module docstring). ``raw_body`` documents a body the
    handler reads itself (multipart, YAML); ``body_required=False`` takes an empty body as
    ``{}``."""

    def declare(handler: Handler) -> Endpoint:
        hints = typing.get_type_hints(handler)
        parameters = inspect.signature(handler).parameters
        unknown = set(parameters) - {*_PARTS, *_GIVEN}
        assert not unknown, f"{handler.__name__}: no such request part {sorted(unknown)}"
        assert "caller" not in parameters or security is Security.WORKER, "caller: worker only"
        parts = {part: hints[part] for part in _PARTS if part in parameters}
        summary, _, description = inspect.cleandoc(handler.__doc__ or "").partition("\n")
        spec = Spec(
            summary=summary.strip(),
            description=description.strip(),
            security=security,
            tags=tags,
            responses=responses,
            errors=errors or {},
            body=parts.get("body", raw_body),
            body_required=body_required,
            query=parts.get("query"),
            path=parts.get("path"),
            headers=parts.get("headers"),
            uses_store=uses_store,
        )
        return Endpoint(handler, spec, parts)

    return declare


def route(path: str, endpoint: Endpoint, method: str) -> Route:
    """The Starlette route of ``endpoint`` (one method per route, as the document lists it)."""
    return Route(path, endpoint.handle, methods=[method], name=endpoint.__name__)


def spec_of(route: Route) -> Spec | None:
    """The spec of a route made by :func:`route`; ``None`` for any other."""
    owner = getattr(route.endpoint, "__self__", None)
    return owner.spec if isinstance(owner, Endpoint) else None
