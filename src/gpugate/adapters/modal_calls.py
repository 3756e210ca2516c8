"""Calls of one deployed Modal function, through the ``modal`` SDK (extra ``gpugate[modal]``):
the only module that imports it, lazily, so the gateway runs without it.

What is used of the SDK, and nothing else: ``Client.from_credentials``,
``Function.from_name(app, function, environment_name=...)`` + ``hydrate(client=...)``,
``Function.spawn(payload)`` → a ``FunctionCall`` whose ``object_id`` is the call id,
``FunctionCall.from_id(id, client=...)``, ``FunctionCall.get(timeout=0)`` (pending: the built-in
``TimeoutError``; ``modal.exception.OutputExpiredError`` once Modal dropped the output; any other
exception is the function's own, re-raised) and ``FunctionCall.cancel()``. The blocking interface
runs in worker threads, outside the event loop.

Verified against a fake module with these names and exceptions (tests/modal), not against Modal's
cloud, which this project cannot reach from its test machines.
"""

from __future__ import annotations

import asyncio
import importlib
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from gpugate.errors import (
    RuntimeAuthFailed,
    RuntimeFailure,
    RuntimeRejected,
    RuntimeUnreachable,
)


class CallPending(Exception):
    """The call has no output yet."""


class CallOutputExpired(Exception):
    """Modal no longer holds the call's output (it keeps outputs for a limited time)."""


@dataclass(frozen=True, slots=True)
class CallFailed(Exception):
    """The function raised: ``kind`` is the exception's class name."""

    kind: str
    message: str


class ModalCalls:
    """Spawn, poll and cancel calls of ``app``/``function`` in ``environment``.

    ``sdk``: the ``modal`` module (tests pass their fake); imported on first use otherwise.
    """

    def __init__(
        self,
        app: str,
        function: str,
        environment: str | None,
        token_id: str,
        token_secret: str,
        *,
        sdk: ModuleType | None = None,
    ) -> None:
        self._app = app
        self._function_name = function
        self._environment = environment
        self._token = (token_id, token_secret)
        self._sdk = sdk
        self._client: Any = None
        self._function: Any = None
        self._lock = asyncio.Lock()

    @property
    def target(self) -> str:
        env = f" in {self._environment}" if self._environment else ""
        return f"modal {self._app}/{self._function_name}{env}"

    async def spawn(self, payload: dict[str, Any]) -> str:
        """Start one call with ``payload``; its call id. Raises a :class:`RuntimeFailure`."""
        function = await self._hydrated()
        call = await self._blocking(function.spawn, payload)
        return str(call.object_id)

    async def poll(self, call_id: str) -> Any:
        """The call's return value; :class:`CallPending`, :class:`CallOutputExpired` or
        :class:`CallFailed` otherwise, or a :class:`RuntimeFailure` when Modal cannot say."""
        sdk, client = await self._connected()
        call = await self._blocking(sdk.FunctionCall.from_id, call_id, client=client)
        exception = importlib.import_module(f"{sdk.__name__}.exception")
        cancelled: Any = exception.InputCancellation  # a BaseException in the SDK
        try:
            return await asyncio.to_thread(call.get, timeout=0)
        except cancelled:
            raise CallFailed("InputCancellation", "the call was cancelled") from None
        except exception.OutputExpiredError:  # first: Modal's timeouts subclass TimeoutError
            raise CallOutputExpired from None
        except TimeoutError:
            raise CallPending from None
        except (exception.AuthError, exception.ConnectionError) as exc:
            raise self._translated(exc, exception) from exc
        except Exception as exc:  # noqa: BLE001 - the function's own exception, by name
            raise CallFailed(type(exc).__name__, str(exc)[:500]) from None

    async def cancel(self, call_id: str) -> None:
        """Cancel the call (harmless when it has ended)."""
        sdk, client = await self._connected()
        call = await self._blocking(sdk.FunctionCall.from_id, call_id, client=client)
        await self._blocking(call.cancel)

    # -- the SDK ---------------------------------------------------------------------------

    async def _connected(self) -> tuple[ModuleType, Any]:
        async with self._lock:
            if self._sdk is None:
                try:
                    self._sdk = importlib.import_module("modal")
                except ImportError as exc:
                    message = f"{self.target}: the modal SDK is not installed (gpugate[modal])"
                    raise RuntimeRejected(message) from exc
            if self._client is None:
                self._client = await self._blocking(self._sdk.Client.from_credentials, *self._token)
            return self._sdk, self._client

    async def _hydrated(self) -> Any:
        sdk, client = await self._connected()
        if self._function is None:
            function = sdk.Function.from_name(
                self._app, self._function_name, environment_name=self._environment
            )
            await self._blocking(function.hydrate, client=client)
            self._function = function
        return self._function

    async def _blocking(self, method: Any, *args: Any, **kwargs: Any) -> Any:
        """Run one blocking SDK call in a thread, its errors as :class:`RuntimeFailure`."""
        sdk = self._sdk
        assert sdk is not None
        exception = importlib.import_module(f"{sdk.__name__}.exception")
        try:
            return await asyncio.to_thread(method, *args, **kwargs)
        except exception.Error as exc:
            raise self._translated(exc, exception) from exc

    def _translated(self, exc: BaseException, exception: ModuleType) -> RuntimeFailure:
        message = f"{self.target}: {type(exc).__name__}: {exc}"
        if isinstance(exc, exception.AuthError):
            return RuntimeAuthFailed(message)
        if isinstance(exc, exception.NotFoundError):
            return RuntimeRejected(message)
        if isinstance(exc, exception.ConnectionError):
            return RuntimeUnreachable(message)
        return RuntimeFailure(message)

    def __repr__(self) -> str:
        return f"<ModalCalls {self.target}>"
