"""A client key's limits on the jobs it creates (issue #16: a key's budget holds on every route).

``POST /v1/jobs`` (and its synchronous front) made through a key with limits is one request of
that key: before the job is stored its estimate is reserved exactly as the data plane reserves a
request's (:meth:`Quota.reserve <gpugate.services.limits.Quota.reserve>`: prompt bytes / 4 plus
its ``max_tokens``, priced with the model's ``price``), so a key over its ``requests_per_min``,
``tokens_per_min`` or daily budget gets the same ``429`` here as there, on every replica.

A job runs later, on any replica, after its creator has gone: it is **charged its estimate** when
it is created (as OpenAI's own rate limits count ``max_tokens`` when a request arrives) and is
not settled again with what it used, so a key's limits never count a job at less than its
ceiling. A create that makes nothing new (the same ``Idempotency-Key`` again, a result-cache
hit) or fails gives the reservation back; a key over its limit still gets the job its
``Idempotency-Key`` made before (a client's retry after a lost answer is a replay, not a new
request). A job holds a ``concurrency`` slot only while it is being made: it is
not a request in flight while it waits or runs.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import TypeVar

from gpugate.core.keys import Principal
from gpugate.errors import KeyLimited
from gpugate.services.jobs import JobRequest
from gpugate.services.limits import Quota

T = TypeVar("T")


async def charged(
    quota: Quota,
    principal: Principal | None,
    request: JobRequest,
    create: Callable[[], Awaitable[tuple[T, bool]]],
    made_before: Callable[[], Awaitable[bool]],
) -> tuple[T, bool]:
    """What ``create()`` answers — ``(answer, made)`` — with the job's estimate reserved before
    and kept when it made a job; the limit's error when the key is over it, unless
    ``made_before()`` (the job exists: ``create()`` replays it, unreserved)."""
    if principal is None or not principal.limited:
        return await create()
    size = len(json.dumps(request.input, separators=(",", ":"), ensure_ascii=False))
    try:
        held = await quota.reserve(principal, request.model, request.input, size)
    except KeyLimited:
        if await made_before():
            return await create()
        raise
    try:
        answer, made = await create()
    except BaseException:
        await quota.release(held)
        raise
    if not made or held is None:
        await quota.release(held)
    else:
        await quota.settle(held, held.prompt_tokens, held.completion_tokens)
    return answer, made
