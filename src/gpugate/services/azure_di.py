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
"""

from __future__ import annotations

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
