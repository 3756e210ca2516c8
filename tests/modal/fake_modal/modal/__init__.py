"""A stand-in for the ``modal`` SDK: the names gpugate and its reference function use, with the
SDK's signatures and exceptions, over an in-process "cloud" (:data:`CLOUD`) that runs spawned
calls in threads. Not Modal: what it verifies is that gpugate uses the SDK's interface as
documented (modal.com/docs/reference), not how Modal's servers behave.

Test controls (not part of the SDK): ``CLOUD.deploy(app, environment_name)``,
``CLOUD.tokens``, ``CLOUD.hold`` (calls wait while it is clear), ``CLOUD.expire(call_id)``,
``CLOUD.calls`` (every call: payload, state), ``CLOUD.unreachable``.
"""

from __future__ import annotations

import builtins
import itertools
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from modal import exception

__all__ = ["CLOUD", "App", "Client", "Function", "FunctionCall", "Image", "exception"]


@dataclass
class _Call:
    function: str
    args: tuple[Any, ...]
    future: Future[Any]
    cancelled: bool = False
    expired: bool = False


@dataclass
class _Cloud:
    tokens: set[tuple[str, str]] = field(default_factory=set)
    deployed: dict[tuple[str, str, str | None], Callable[..., Any]] = field(default_factory=dict)
    calls: dict[str, _Call] = field(default_factory=dict)
    hold: threading.Event = field(default_factory=threading.Event)
    unreachable: bool = False
    _ids: itertools.count[int] = field(default_factory=itertools.count)
    _pool: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(8))

    def __post_init__(self) -> None:
        self.hold.set()

    def deploy(self, app: App, environment_name: str | None = None) -> None:
        for name, function in app.registered_functions.items():
            self.deployed[(app.name, name, environment_name)] = function

    def expire(self, call_id: str) -> None:
        self.calls[call_id].expired = True

    def reset(self) -> None:
        self.tokens.clear()
        self.deployed.clear()
        self.calls.clear()
        self.hold.set()
        self.unreachable = False

    def check(self, client: Client | None) -> None:
        if self.unreachable:
            raise exception.ConnectionError("could not connect to api.modal.com")
        if client is None or (client.token_id, client.token_secret) not in self.tokens:
            raise exception.AuthError("Token missing or invalid")

    def spawn(self, function: str, target: Callable[..., Any], args: tuple[Any, ...]) -> str:
        call_id = f"fc-{next(self._ids):08d}"

        def run() -> Any:
            self.hold.wait(timeout=30)
            return target(*args)

        self.calls[call_id] = _Call(function, args, self._pool.submit(run))
        return call_id


CLOUD = _Cloud()


class Client:
    def __init__(self, token_id: str, token_secret: str) -> None:
        self.token_id = token_id
        self.token_secret = token_secret

    @classmethod
    def from_credentials(cls, token_id: str, token_secret: str) -> Client:
        return cls(token_id, token_secret)


class Image:
    @classmethod
    def debian_slim(cls, python_version: str | None = None) -> Image:
        return cls()

    def pip_install(self, *packages: str) -> Image:
        return self


class App:
    def __init__(self, name: str | None = None) -> None:
        self.name = name or "app"
        self.registered_functions: dict[str, Callable[..., Any]] = {}

    def function(self, **options: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        def register(target: Callable[..., Any]) -> Callable[..., Any]:
            self.registered_functions[target.__name__] = target
            return target

        return register


class Function:
    def __init__(self, app_name: str, name: str, environment_name: str | None) -> None:
        self._key = (app_name, name, environment_name)
        self._target: Callable[..., Any] | None = None
        self._client: Client | None = None

    @classmethod
    def from_name(
        cls, app_name: str, name: str, *, environment_name: str | None = None
    ) -> Function:
        return cls(app_name, name, environment_name)  # lazy, as the SDK's: nothing is looked up

    def hydrate(self, client: Client | None = None) -> Function:
        CLOUD.check(client)
        target = CLOUD.deployed.get(self._key)
        if target is None:
            app, name, env = self._key
            raise exception.NotFoundError(
                f"Lookup failed for Function '{name}' in app '{app}' ({env})"
            )
        self._target, self._client = target, client
        return self

    def spawn(self, *args: Any) -> FunctionCall:
        if self._target is None:
            self.hydrate(self._client)
        assert self._target is not None
        CLOUD.check(self._client)
        return FunctionCall(CLOUD.spawn(self._key[1], self._target, args))


class FunctionCall:
    def __init__(self, object_id: str) -> None:
        self.object_id = object_id

    @classmethod
    def from_id(cls, function_call_id: str, client: Client | None = None) -> FunctionCall:
        CLOUD.check(client)
        if function_call_id not in CLOUD.calls:
            raise exception.NotFoundError(f"No such function call {function_call_id}")
        return cls(function_call_id)

    def get(self, timeout: float | None = None) -> Any:
        call = CLOUD.calls[self.object_id]
        if call.cancelled:
            raise exception.InputCancellation(self.object_id)
        if call.expired:
            raise exception.OutputExpiredError(f"output of {self.object_id} expired")
        try:
            return call.future.result(timeout=timeout)
        except builtins.TimeoutError:
            raise builtins.TimeoutError from None

    def cancel(self, terminate_containers: bool = False) -> None:
        CLOUD.calls[self.object_id].cancelled = True
