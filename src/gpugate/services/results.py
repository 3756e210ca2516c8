"""Job results: small ones inline in the job's row, large ones in the blob store.

A result whose JSON is larger than ``blobs.inline_max_bytes`` is written to the blob store under
``results/<slug>/<nonce>.json`` before the job is completed, and the row keeps the key
(``result_ref``) instead of the document: the jobs table stays small and a job read stays cheap
however large the answers get. ``GET /v1/jobs/{slug}/result`` serves either kind.
"""

from __future__ import annotations

import json
import secrets
from typing import Any

from gpugate.adapters.blobs import BlobStore
from gpugate.errors import BlobNotFound, JobNotCompleted
from gpugate.store import JobRecord, JobStore

_JSON = "application/json"


class Results:
    """Decides where a result is kept and reads it back.

    Without a blob store (``Results()``: runtimes a test builds by hand) every result is inline.
    """

    def __init__(self, blobs: BlobStore | None = None, inline_max_bytes: int = 0) -> None:
        self._blobs = blobs
        self._max = inline_max_bytes

    async def keep(
        self, slug: str, result: Any, *, size_hint: int | None = None
    ) -> tuple[Any, str | None]:
        """``(result, None)`` to store inline, or ``(None, key)`` once a large result is in the
        blob store. ``size_hint``: the size of the answer it was parsed from, if known, which
        spares encoding a small result only to measure it."""
        if self._blobs is None or (size_hint is not None and size_hint <= self._max):
            return result, None
        body = json.dumps(result, separators=(",", ":")).encode()
        if len(body) <= self._max:
            return result, None
        key = f"results/{slug}/{secrets.token_hex(8)}.json"
        await self._blobs.put(key, body, content_type=_JSON)
        return None, key

    async def complete(
        self,
        store: JobStore,
        slug: str,
        token: str,
        result: Any,
        *,
        actor: str,
        cost_cents: float | None = None,
        size_hint: int | None = None,
    ) -> bool:
        """Complete the job with ``result``, spilled to the blob store first if large
        (:meth:`keep`); False when the lease was lost (the store's fenced write)."""
        result, ref = await self.keep(slug, result, size_hint=size_hint)
        return await store.complete(
            slug, token, result=result, result_ref=ref, cost_cents=cost_cents, actor=actor
        )

    async def read(self, job: JobRecord) -> bytes:
        """The completed job's result as JSON bytes, wherever it is kept."""
        if job.state != "completed":
            raise JobNotCompleted(f"job {job.slug} is {job.state}; it has no result")
        if job.result_ref is not None:
            if self._blobs is None:
                raise BlobNotFound(f"job {job.slug}'s result is in a blob store not given here")
            return await self._blobs.get(job.result_ref)
        return json.dumps(job.result, separators=(",", ":")).encode()

    def __repr__(self) -> str:
        return f"<Results inline up to {self._max} bytes, else {self._blobs!r}>"
