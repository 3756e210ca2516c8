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

    def __init__(
        self, status: int, code: str, message: str, problems: list[dict[str, Any]] | None = None
    ) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.problems = problems or []  # CONFIG_INVALID: [{path, message, line}]


class GatewayApi:
    """``request(method, path, body)`` against one gateway, JSON in and out; ``send`` for any
    other body (a YAML config). ``token``: the admin token; ``actor``: who acts, for the audit
    log (``X-Gpugate-Actor``)."""

    def __init__(
        self,
        base_url: str,
        *,
        token: str | None = None,
        actor: str | None = None,
        timeout_s: float = 30.0,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._token = token
        self._actor = actor
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
        status, _, raw = self.send(method, path, data, headers=sent)
        return status, json.loads(raw or b"null")

    def send(
        self, method: str, path: str, data: bytes | None = None, *, headers: dict[str, str]
    ) -> tuple[int, dict[str, str], bytes]:
        """One request with a raw body; (status, headers with lower-case names, raw body)."""
        sent = dict(headers)
        if self._token:
            sent["Authorization"] = f"Bearer {self._token}"
        if self._actor:
            sent["X-Gpugate-Actor"] = self._actor
        req = urllib.request.Request(self.base_url + path, data=data, headers=sent, method=method)  # noqa: S310 - the operator's own gateway URL
        try:
            with urllib.request.urlopen(req, timeout=self._timeout_s) as resp:  # noqa: S310
                got = {name.lower(): value for name, value in resp.headers.items()}
                return resp.status, got, resp.read()
        except urllib.error.HTTPError as exc:
            raise _api_error(exc) from exc
        except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
            raise GpugateError(f"cannot reach the gateway at {self.base_url}: {exc}") from exc

    def __repr__(self) -> str:
        return f"<GatewayApi {self.base_url}>"


def _api_error(exc: urllib.error.HTTPError) -> GatewayApiError:
    try:
        error = json.loads(exc.read())["error"]
        code, message = str(error.get("code")), str(error.get("message"))
        return GatewayApiError(exc.code, code, message, error.get("problems"))
    except (ValueError, KeyError, TypeError):
        return GatewayApiError(exc.code, "HTTP_ERROR", exc.reason)
