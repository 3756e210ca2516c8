"""A small client of a running gateway's HTTP API, for the ``gpugate jobs|runtimes|config``
commands. Blocking (the CLI does one request at a time) and stdlib-only."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from gpugate.errors import GpugateError


class GatewayApiError(GpugateError):
    """The gateway answered with an error."""

    code = "GATEWAY_API_ERROR"

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code


class GatewayApi:
    """``request(method, path, body)`` against one gateway, JSON in and out."""

    def __init__(self, base_url: str, *, token: str | None = None, timeout_s: float = 30.0) -> None:
        self.base_url = base_url.rstrip("/")
        self._token = token
        self._timeout_s = timeout_s

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        sent = {"Accept": "application/json", **(headers or {})}
        if data is not None:
            sent["Content-Type"] = "application/json"
        if self._token:
            sent["Authorization"] = f"Bearer {self._token}"
        req = urllib.request.Request(self.base_url + path, data=data, headers=sent, method=method)  # noqa: S310 - the operator's own gateway URL
        try:
            with urllib.request.urlopen(req, timeout=self._timeout_s) as resp:  # noqa: S310
                return resp.status, json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as exc:
            raise _api_error(exc) from exc
        except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
            raise GpugateError(f"cannot reach the gateway at {self.base_url}: {exc}") from exc

    def __repr__(self) -> str:
        return f"<GatewayApi {self.base_url}>"


def _api_error(exc: urllib.error.HTTPError) -> GatewayApiError:
    try:
        error = json.loads(exc.read())["error"]
        return GatewayApiError(exc.code, str(error.get("code")), str(error.get("message")))
    except (ValueError, KeyError, TypeError):
        return GatewayApiError(exc.code, "HTTP_ERROR", exc.reason)
