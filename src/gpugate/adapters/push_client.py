"""The gateway's HTTP client for push workers: small JSON requests, signed, errors translated once.

A push worker is reached at ``push.url`` (DESIGN §3, push protocol). With ``push.auth: signed``
(the default) every request is signed with the gateway-to-worker key derived from the runtime's
secret (:mod:`gpugate.push_signature`) and every answer must carry the worker's signature bound
to that request, else it is :class:`~gpugate.errors.RuntimeAuthFailed`: a forged or replayed
answer (say, a ``completed`` status for the reaper) is never believed. The secret itself never
travels. With ``push.auth: bearer`` (compatibility with a wave-1 worker) the request carries
``Authorization: Bearer <secret>`` and the answer is taken as it comes.

:meth:`PushClient.for_runtime` gives each runtime its view of the one pooled session: its
signing mode and its TLS settings (``push.ca_file``, and the gateway's own ``tls`` certificate
as the client certificate for a worker that requires mTLS).

What goes wrong on the way becomes a :class:`~gpugate.errors.RuntimeFailure` here, where it
enters: a refused connection is :class:`~gpugate.errors.RuntimeRefused` (nothing listens
there, so no call of that worker runs), any other failure to connect or to read the answer
:class:`~gpugate.errors.RuntimeUnreachable`, a timeout :class:`~gpugate.errors.RuntimeTimeout`.
"""

from __future__ import annotations

import json
import ssl
from typing import TYPE_CHECKING, Any

from gpugate import push_signature
from gpugate.errors import RuntimeAuthFailed, RuntimeRefused, RuntimeTimeout, RuntimeUnreachable

if TYPE_CHECKING:
    import aiohttp

MAX_ANSWER_BYTES = 64 * 1024 * 1024


class _Session:
    """The one pooled aiohttp session every runtime's client shares, made at its first request:
    aiohttp (and yarl, multidict...) are ~10 MB of a gateway's resident memory, imported only
    by a gateway that talks to a push worker (issue #21, the RSS target)."""

    def __init__(self) -> None:
        self.started = False
        self.http: aiohttp.ClientSession | None = None

    def get(self) -> aiohttp.ClientSession:
        assert self.started, "PushClient.start() was not awaited"
        if self.http is None:
            import aiohttp

            self.http = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(keepalive_timeout=30.0),
                timeout=aiohttp.ClientTimeout(total=None),
            )
        return self.http


class PushClient:
    """A pooled keep-alive client for the push workers of every push runtime."""

    def __init__(
        self,
        *,
        connect_timeout_s: float = 5.0,
        auth: str = "signed",
        tls: ssl.SSLContext | None = None,
        shared: _Session | None = None,
    ) -> None:
        self._connect_timeout_s = connect_timeout_s
        self._auth = auth
        self._tls = tls
        self._shared = shared or _Session()
        self._owner = shared is None

    def for_runtime(self, *, auth: str, tls: ssl.SSLContext | None) -> PushClient:
        """This client's session with one runtime's signing mode and TLS settings."""
        return PushClient(
            connect_timeout_s=self._connect_timeout_s, auth=auth, tls=tls, shared=self._shared
        )

    async def start(self) -> None:
        self._shared.started = True

    async def close(self) -> None:
        if self._owner:
            self._shared.started = False
            if self._shared.http is not None:
                await self._shared.http.close()
                self._shared.http = None

    async def request(
        self,
        method: str,
        url: str,
        *,
        secret: str,
        body: dict[str, Any] | None = None,
        timeout_s: float,
    ) -> tuple[int, Any]:
        """Send ``body`` (JSON) and read the answer within ``timeout_s`` all told."""
        import aiohttp
        from yarl import URL

        session = self._shared.get()
        timeout = aiohttp.ClientTimeout(
            total=timeout_s, sock_connect=min(self._connect_timeout_s, timeout_s)
        )
        target = URL(url)
        data = b"" if body is None else json.dumps(body).encode()
        headers, nonce = push_signature.credentials(
            secret,
            push_signature.GATEWAY_TO_WORKER,
            self._auth,
            method=method,
            target=target.raw_path_qs,
            body=data,
            lease_token=None,
        )
        if body is not None:
            headers["Content-Type"] = "application/json"
        try:
            async with session.request(
                method,
                target,
                data=data or None,
                headers=headers,
                timeout=timeout,
                allow_redirects=False,
                ssl=self._tls if self._tls is not None else True,
            ) as resp:
                raw = await resp.content.read(MAX_ANSWER_BYTES)
                if nonce is not None:
                    self._check_answer(url, secret, nonce, resp, raw)
                return resp.status, _json_or_none(raw)
        except aiohttp.ConnectionTimeoutError as exc:
            raise RuntimeTimeout(f"connect to {url} timed out") from exc
        except aiohttp.ClientConnectorError as exc:
            if isinstance(exc.os_error, ConnectionRefusedError):
                raise RuntimeRefused(f"nothing listens at {url} (connection refused)") from exc
            raise RuntimeUnreachable(f"cannot connect to {url}: {exc}") from exc
        except (TimeoutError, aiohttp.ServerTimeoutError) as exc:
            raise RuntimeTimeout(f"{url} did not answer within {timeout_s} s") from exc
        except aiohttp.ClientError as exc:
            raise RuntimeUnreachable(f"{url} failed before answering: {exc}") from exc

    @staticmethod
    def _check_answer(
        url: str, secret: str, nonce: str, resp: aiohttp.ClientResponse, raw: bytes
    ) -> None:
        key = push_signature.derive_key(secret, push_signature.WORKER_TO_GATEWAY)
        if not push_signature.response_valid(
            key,
            push_signature.WORKER_TO_GATEWAY,
            resp.headers.get(push_signature.HEADER),
            request_nonce=nonce,
            status=resp.status,
            body=raw,
        ):
            raise RuntimeAuthFailed(
                f"{url} answered {resp.status} without the worker's signature for this request "
                "(another secret, a worker that speaks only bearer: push.auth, or a forgery)"
            )

    def __repr__(self) -> str:
        state = "open" if self._shared.started else "closed"
        return f"<PushClient {state} auth={self._auth}>"


def _json_or_none(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return None
