"""The gateway's HTTP client for push workers: small JSON requests, errors translated once.

A push worker is reached at ``push.url`` (DESIGN §3, push protocol). Every request carries
``Authorization: Bearer <the runtime's secret>`` and answers ``(status, parsed JSON or None)``;
what goes wrong on the way becomes a :class:`~gpugate.errors.RuntimeFailure` here, where it
enters: a refused connection is :class:`~gpugate.errors.RuntimeRefused` (nothing listens
there, so no call of that worker runs), any other failure to connect or to read the answer
:class:`~gpugate.errors.RuntimeUnreachable`, a timeout :class:`~gpugate.errors.RuntimeTimeout`.
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp

from gpugate.errors import RuntimeRefused, RuntimeTimeout, RuntimeUnreachable

MAX_ANSWER_BYTES = 64 * 1024 * 1024


class PushClient:
    """A pooled keep-alive client for the push workers of every push runtime."""

    def __init__(self, *, connect_timeout_s: float = 5.0) -> None:
        self._connect_timeout_s = connect_timeout_s
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(keepalive_timeout=30.0),
            timeout=aiohttp.ClientTimeout(total=None),
        )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

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
        assert self._session is not None, "PushClient.start() was not awaited"
        timeout = aiohttp.ClientTimeout(
            total=timeout_s, sock_connect=min(self._connect_timeout_s, timeout_s)
        )
        headers = {"Authorization": f"Bearer {secret}"}
        try:
            async with self._session.request(
                method, url, json=body, headers=headers, timeout=timeout, allow_redirects=False
            ) as resp:
                raw = await resp.content.read(MAX_ANSWER_BYTES)
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

    def __repr__(self) -> str:
        return f"<PushClient {'open' if self._session is not None else 'closed'}>"


def _json_or_none(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return None
