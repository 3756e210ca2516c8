"""The Azure Document Intelligence pass-through: ``/azure-di/{path}`` → an ``azure-di`` upstream.

Azure DI is asynchronous: ``POST .../documentModels/{model}:analyze`` answers ``202`` with an
``Operation-Location`` (the result's URL) and a ``Retry-After``; the client polls that URL with
``GET`` until the result's ``status`` is ``succeeded`` or ``failed``. This façade forwards both
through the gateway's own proxy path (admission pool, endpoint health, metrics, one connect
retry) and rewrites ``Operation-Location`` to the gateway, so the polls come back through it and
the client never learns the resource's address nor needs its key.

* Which upstream: the ``azure-di`` upstream whose ``models`` lists the DI model id (the config
  rules allow one per model id, and one URL per such upstream, so a poll always reaches the
  resource that took the analyze). Another model id → ``UNKNOWN_MODEL``.
* The key: ``api_key_env``'s value, sent as ``Ocp-Apim-Subscription-Key`` (any credential the
  client sent is dropped); it is never logged nor put in an error.
* Not shed: an Azure DI resource is an external service that uses no GPU of ours, so there is
  nothing to shed for (the seed leaves this path ungated). The shed gate is still asked, like
  every proxied request, and always lets it through: an ``azure-di`` upstream has no
  ``gpu_ids``, so it is never saturated.
* Policy: ``X-Allow-External: false`` (the request may not leave the building) refuses it with
  ``403 EXTERNAL_UPSTREAM_FORBIDDEN``, analyze and polls alike.
* Where ``Operation-Location`` points (:func:`gateway_base`): ``server.public_url`` when it is
  set; otherwise the address the client used, but only when its ``Host`` is a loopback name or
  the ``listen`` host — any other ``Host`` is refused with ``400`` before anything is sent
  upstream, so a forged ``Host`` cannot point a client's polls (and the key it sends with them)
  at another server (issue #15 finding 8).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

from gpugate.clock import Clock
from gpugate.config import GatewayConfig
from gpugate.core.classes import RequestClass
from gpugate.errors import BadRequest, ExternalUpstreamForbidden, GpugateError, UnknownModel
from gpugate.services.proxy import Outbound, Proxy, Reply

PREFIX = "/azure-di"
ALLOW_EXTERNAL = "x-allow-external"

_ROUTE = re.compile(
    r"(?P<api>documentintelligence|formrecognizer)/documentModels/(?P<model>[^/:]+)"
    r"(?P<op>:analyze|/analyzeResults/[^/]+)"
)


@dataclass(frozen=True, slots=True)
class DiRequest:
    """One request to the façade, as the web layer read it."""

    method: str
    path: str  # after ``/azure-di/``, e.g. ``documentintelligence/documentModels/m:analyze``
    query: str
    headers: list[tuple[bytes, bytes]]
    body: bytes | None
    cls: RequestClass


def allow_external(value: str | None) -> bool:
    """The ``X-Allow-External`` header: absent or ``true`` → True, ``false`` → False."""
    if value is None or value.lower() == "true":
        return True
    if value.lower() == "false":
        return False
    raise BadRequest(f"X-Allow-External must be true or false; got {value!r}")


_LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain"})
_WILDCARDS = frozenset({"", "0.0.0.0", "::"})  # noqa: S104 - listen addresses, compared only


def _loopback(host: str) -> bool:
    if host in _LOOPBACK_NAMES or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def gateway_base(
    public_url: str | None, listen_host: str, request_base: str, host_header: str | None
) -> str:
    """The base URL ``Operation-Location`` is built on: ``public_url``; else ``request_base``
    (the scheme and ``Host`` the client used) when that ``Host`` names this machine's loopback
    or the ``listen`` host; else :class:`BadRequest` naming ``server.public_url``."""
    if public_url is not None:
        return public_url
    host = (urlsplit(f"//{host_header}").hostname or "") if host_header else ""
    if host and (_loopback(host) or (listen_host not in _WILDCARDS and host == listen_host)):
        return request_base
    raise BadRequest(
        f"Host {host_header!r} is not this gateway's address as configured: the Azure DI "
        "facade builds Operation-Location from server.public_url (set it to the URL clients "
        "use) or from a loopback or listen-host Host"
    )


def rewrite_location(location: str, upstream_url: str, gateway_base: str) -> str:
    """``Operation-Location`` pointing at the gateway: the same path and query under
    ``{gateway_base}/azure-di``, with the upstream URL's own path prefix (if any) removed."""
    parts = urlsplit(location)
    prefix = urlsplit(upstream_url).path.rstrip("/")
    path = parts.path
    if prefix and path.startswith(prefix + "/"):
        path = path[len(prefix) :]
    query = f"?{parts.query}" if parts.query else ""
    return f"{gateway_base.rstrip('/')}{PREFIX}{path}{query}"


class AzureDocumentIntelligence:
    """Forwards analyze and poll requests to the ``azure-di`` upstreams; see the module doc."""

    def __init__(self, proxy: Proxy, config: Callable[[], GatewayConfig], clock: Clock) -> None:
        self._proxy = proxy
        self._config = config
        self._clock = clock
        self.forwarded = 0

    def outbound(self, request: DiRequest, *, external_allowed: bool) -> Outbound:
        """The request to send upstream; BadRequest for a path that is neither an analyze
        (``POST``) nor a poll (``GET``), UnknownModel, or ExternalUpstreamForbidden."""
        match = _ROUTE.fullmatch(request.path)
        analyze = match is not None and match["op"] == ":analyze"
        if match is None or request.method != ("POST" if analyze else "GET"):
            raise BadRequest(
                "not an Azure Document Intelligence call: expected POST "
                f"{PREFIX}/documentintelligence/documentModels/{{model}}:analyze or GET "
                f"{PREFIX}/documentintelligence/documentModels/{{model}}/analyzeResults/{{id}}"
            )
        model = match["model"]
        upstream = self._config().azure_di_upstream(model)
        if upstream is None:
            raise UnknownModel(f"no azure-di upstream serves Document Intelligence model {model!r}")
        if not external_allowed:
            raise ExternalUpstreamForbidden(
                f"Document Intelligence model {model!r} is served only by the external "
                f"upstream {upstream.id!r}, and this request may not leave the building"
            )
        query = f"?{request.query}" if request.query else ""
        return Outbound(
            request.method,
            f"/{request.path}{query}",
            request.headers,
            request.body,
            request.cls,
            self._clock.monotonic(),
            model=model,
            upstream_id=upstream.id,
        )

    async def open(self, out: Outbound) -> Reply:
        """Send through the proxy path; the caller relays and closes the reply."""
        reply = await self._proxy.open(out)
        self.forwarded += 1
        return reply

    def refused(self, out: Outbound, exc: GpugateError) -> None:
        """Count a request that ended with one of our errors before any reply."""
        self._proxy.refused(out, exc)

    def __repr__(self) -> str:
        return f"<AzureDocumentIntelligence forwarded={self.forwarded}>"
