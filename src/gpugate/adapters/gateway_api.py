"""A small client of a running gateway's HTTP API, for the ``gpugate jobs|runtimes|config``
commands. Blocking (the CLI does one request at a time) and stdlib-only.

A redirect is followed only within the gateway's origin (scheme, host and port): the admin token
rides on every request, and a redirect to another origin would hand it over (as curl and
requests, the client refuses; issue #15 finding 8). ``tls`` verifies a gateway whose
certificate a private CA signed, and presents a client certificate to one that requires it.

What goes wrong on the way is a :class:`~gpugate.errors.GpugateError` that says what: a base URL
that is not an ``http(s)://`` one (:func:`base_url_problem`), a gateway that cannot be reached
or does not speak HTTP, an error answer (:class:`GatewayApiError`), an answer that is not JSON.
"""

from __future__ import annotations

import http.client
import json
import ssl
import urllib.error
import urllib.request
from http.client import HTTPMessage
from typing import IO, Any
from urllib.parse import urlsplit

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


def client_tls(
    ca_file: str | None = None, cert_file: str | None = None, key_file: str | None = None
) -> ssl.SSLContext | None:
    """The TLS settings for an ``https://`` gateway: trust ``ca_file`` (else the system's CAs)
    and present ``cert_file``/``key_file`` (mTLS); None when nothing is asked for."""
    if ca_file is None and cert_file is None:
        return None
    try:
        context = ssl.create_default_context(cafile=ca_file)
    except (OSError, ssl.SSLError) as exc:
        raise GpugateError(f"cannot load the CA bundle {ca_file}: {_reason(exc)}") from exc
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if cert_file is not None:
        try:
            context.load_cert_chain(cert_file, key_file)
        except (OSError, ssl.SSLError) as exc:
            what = f"the client certificate {cert_file}"
            raise GpugateError(f"cannot load {what}: {_reason(exc)}") from exc
    return context


def _reason(exc: OSError | ssl.SSLError) -> str:
    """Why a file did not load: ``No such file or directory``, not ``[Errno 2] ...``."""
    return exc.strerror or getattr(exc, "reason", None) or str(exc)


def base_url_problem(url: str) -> str | None:
    """Why ``url`` cannot be a gateway's base URL, or None when it can."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - reading it checks it: not a number, out of range
    except ValueError as exc:  # "Invalid IPv6 URL", "Port out of range 0-65535", ...
        return str(exc)
    if parts.scheme not in ("http", "https"):
        return "it must start with http:// or https://"
    if not parts.hostname:
        return "it names no host"
    return None


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urlsplit(url)
    default = {"http": 80, "https": 443}.get(parts.scheme)
    return parts.scheme, (parts.hostname or "").lower(), parts.port or default


class _SameOriginRedirects(urllib.request.HTTPRedirectHandler):
    """Follows a redirect within the request's origin; refuses one that leaves it."""

    def redirect_request(
        self,
        req: urllib.request.Request,
        fp: IO[bytes],
        code: int,
        msg: str,
        headers: HTTPMessage,
        newurl: str,
    ) -> urllib.request.Request | None:
        if _origin(newurl) != _origin(req.full_url):
            scheme, host, port = _origin(newurl)
            raise GpugateError(
                f"the gateway redirected to another origin ({scheme}://{host}:{port}); not "
                "following it with your credentials (use --gateway with that URL if you trust it)"
            )
        return super().redirect_request(req, fp, code, msg, headers, newurl)


class GatewayApi:
    """``request(method, path, body)`` against one gateway, JSON in and out; ``send`` for a raw
    body and a raw answer (a YAML config), ``send_for_json`` for a raw body and a JSON answer.
    ``token``: the admin token; ``actor``: who acts, for the audit log (``X-Gpugate-Actor``)."""

    def __init__(
        self,
        base_url: str,
        *,
        token: str | None = None,
        actor: str | None = None,
        timeout_s: float = 30.0,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        problem = base_url_problem(base_url)
        if problem is not None:
            raise GpugateError(f"not a gateway URL: {base_url!r}: {problem}")
        self.base_url = base_url.rstrip("/")
        self._token = token
        self._actor = actor
        self._timeout_s = timeout_s
        handlers: list[urllib.request.BaseHandler] = [_SameOriginRedirects()]
        if tls is not None:
            handlers.append(urllib.request.HTTPSHandler(context=tls))
        self._opener = urllib.request.build_opener(*handlers)

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        sent = {"Accept": "application/json"}
        if data is not None:
            sent["Content-Type"] = "application/json"
        return self.send_for_json(method, path, data, headers={**sent, **(headers or {})})

    def send_for_json(
        self, method: str, path: str, data: bytes | None = None, *, headers: dict[str, str]
    ) -> tuple[int, Any]:
        """:meth:`send`, and the answer's JSON; an answer that is not JSON (another server at
        that address: a proxy's login page, a web server) is a :class:`GpugateError` saying
        so, with its status and content type."""
        status, got, raw = self.send(method, path, data, headers=headers)
        try:
            return status, json.loads(raw or b"null")
        except ValueError as exc:
            kind = got.get("content-type") or "no Content-Type"
            raise GpugateError(
                f"the answer to {method} {path} was not JSON ({status}, {kind}): is "
                f"{self.base_url} a gpugate gateway?"
            ) from exc

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
            with self._opener.open(req, timeout=self._timeout_s) as resp:
                got = {name.lower(): value for name, value in resp.headers.items()}
                return resp.status, got, resp.read()
        except urllib.error.HTTPError as exc:
            raise _api_error(exc) from exc
        except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
            raise GpugateError(f"cannot reach the gateway at {self.base_url}: {exc}") from exc
        except http.client.HTTPException as exc:  # it answered, but not in HTTP
            what = type(exc).__name__
            raise GpugateError(
                f"the gateway at {self.base_url} did not answer HTTP: {what}"
            ) from exc

    def __repr__(self) -> str:
        return f"<GatewayApi {self.base_url}>"


def _api_error(exc: urllib.error.HTTPError) -> GatewayApiError:
    try:
        error = json.loads(exc.read())["error"]
        code, message = str(error.get("code")), str(error.get("message"))
        return GatewayApiError(exc.code, code, message, error.get("problems"))
    except (ValueError, KeyError, TypeError):
        return GatewayApiError(exc.code, "HTTP_ERROR", exc.reason)
