"""The synchronous job front: ``POST /v1/jobs?wait=SECONDS``, the seed's ``SyncForward``.

In this order (seed 000, DESIGN §4 — what uses no GPU is served before the gate):

1. **idempotent replay** — a job created with this ``Idempotency-Key`` exists: it is waited for
   and returned; neither the cache nor the gate is asked;
2. **result cache** — the model's cache (opt in, :mod:`.result_cache`) holds a result for this
   model, operation and input: 200 with it, ``X-Gateway-Cache: hit``; no job, no GPU, and the
   shed counter is not touched, so it is served even while the GPUs are saturated.
   ``Cache-Control: no-cache`` skips the lookup (the fresh result is still stored);
3. **shed gate** — ``batch`` work whose every candidate upstream is saturated is refused with
   429 ``GPU_SATURATED`` (counted once in ``gateway_gpu_shed_total{site="sync_front"}``) and no
   job is created. Candidates are the upstreams serving the model (not the ``external`` ones
   for a job with ``allow_external: false``); a model only push or serverless runtimes serve
   has none, and is not gated here;
4. **dispatch** — the job is created as ``POST /v1/jobs`` does (the key honoured) and waited for
   up to ``wait`` seconds (at most :data:`MAX_WAIT_S`): 200 with the job when it finished in
   time (``completed`` with its ``result``, or ``failed``/``cancelled`` with its ``error``), else
   202 with the job to poll. A ``completed`` result of a cached model is stored in the cache.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpugate.config import CacheConfig, GatewayConfig
from gpugate.errors import NoHealthyUpstream, UnknownModel
from gpugate.services.job_waiter import JobWaiter
from gpugate.services.jobs import JobRequest, Jobs, check_same_request, job_view, tenant_key
from gpugate.services.proxy import Outbound, Proxy
from gpugate.services.result_cache import ResultCache, cache_key, cache_policy
from gpugate.store import JobRecord, JobStore

MAX_WAIT_S = 300.0
SHED_SITE = "sync_front"


@dataclass(frozen=True, slots=True)
class SyncAnswer:
    """What the front answers: 200 (finished or cached) or 202 (still running), the job's view,
    the cache's verdict (None when the model is not cached), and whether this call made the job
    (not a repeat of an ``Idempotency-Key`` nor a cache hit)."""

    status: int
    view: dict[str, Any]
    cache: str | None = None
    made: bool = False


class SyncFront:
    """Create a job and wait for it, with the result cache and the shed gate in front."""

    def __init__(
        self,
        jobs: Jobs,
        store: JobStore,
        waiter: JobWaiter,
        cache: ResultCache,
        proxy: Proxy,
        config: Callable[[], GatewayConfig],
    ) -> None:
        self._jobs = jobs
        self._store = store
        self._waiter = waiter
        self._cache = cache
        self._proxy = proxy
        self._config = config

    async def create(
        self,
        request: JobRequest,
        *,
        idempotency_key: str | None,
        wait_s: float,
        use_cache: bool = True,
    ) -> SyncAnswer:
        """The seed's order, step by step; see the module docstring."""
        wait_s = min(max(wait_s, 0.0), MAX_WAIT_S)
        if idempotency_key is not None:
            stored_key = tenant_key(request.tenant, idempotency_key)
            existing = await self._store.job_by_idempotency_key(stored_key)  # type: ignore[arg-type]
            if existing is not None:
                check_same_request(existing, request)
                return self._answer(await self._waiter.wait(existing, wait_s), None)
        config = self._config()
        policy = cache_policy(config, request.model, request.runner or config.default_runtime)
        key = (
            None
            if policy is None
            else cache_key(request.model, request.operation, request.input, request.tenant)
        )
        if key is not None and use_cache:
            cached = self._cache.get(request.model, key)
            if cached is not None:
                return SyncAnswer(200, cached, "hit")
        self._shed_gate(request)
        job, made = await self._jobs.create(request, idempotency_key=idempotency_key)
        job = await self._waiter.wait(job, wait_s)
        if policy is not None and key is not None:
            self._remember(job, key, policy)
        return self._answer(job, None if policy is None else "miss", made=made)

    def _shed_gate(self, request: JobRequest) -> None:
        """429 GPU_SATURATED for batch work when every upstream of the model is saturated."""
        gate = self._proxy.gate
        if gate is None:
            return
        probe = Outbound("POST", "", [], None, request.cls, 0.0, model=request.model)
        try:
            candidates = self._proxy.candidates(probe)
        except (UnknownModel, NoHealthyUpstream):
            return  # nothing here to shed for: the job path decides
        if not request.allow_external:  # an external upstream is no candidate of this job
            candidates = [u for u in candidates if not u.config.external]
        gate.admit(candidates, request.cls, SHED_SITE)

    def _remember(self, job: JobRecord, key: str, policy: CacheConfig) -> None:
        if job.state == "completed" and job.result_ref is None:
            self._cache.put(job.model, key, job_view(job), policy)

    @staticmethod
    def _answer(job: JobRecord, cache: str | None, *, made: bool = False) -> SyncAnswer:
        return SyncAnswer(200 if job.terminal else 202, job_view(job), cache, made)

    def __repr__(self) -> str:
        return f"<SyncFront {self._cache!r} {self._waiter!r}>"
