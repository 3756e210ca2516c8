"""The jobs API's use cases: create (idempotent), read, list, events, cancel, retry.

Creating a job stores it and wakes the dispatcher at once (DESIGN §5.1); the same
``Idempotency-Key`` always yields the same job, whatever its state, so a client that resubmits
is never handed a second job — nor a dead one: a shed job is deferred, not failed.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Protocol

from gpugate.config import GatewayConfig
from gpugate.core.classes import RequestClass
from gpugate.core.job_states import LEASED_STATES
from gpugate.core.job_transitions import new_slug
from gpugate.errors import BadRequest, IdempotencyKeyReused, JobNotFound, UnknownModel
from gpugate.store import JOB_STATES, JobEvent, JobPage, JobRecord, JobStore, NewJob
from gpugate.store.keys import KeyStore
from gpugate.store.replicas import ReplicaStore

log = logging.getLogger("gpugate.jobs")

JOB_KIND = "job"  # what the tenancy table calls a job

SLUG = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
OPERATIONS = ("chat/completions", "completions", "embeddings")


@dataclass(frozen=True, slots=True)
class JobRequest:
    """A validated ``POST /v1/jobs`` body."""

    model: str
    input: dict[str, Any]
    operation: str = "chat/completions"
    cls: RequestClass = RequestClass.BATCH
    runner: str | None = None
    slug: str | None = None
    allow_external: bool = True
    tenant: str | None = None  # auth.mode: keys: the tenant that creates (and owns) the job


class JobsStore(JobStore, KeyStore, ReplicaStore, Protocol):
    """The slice of the store the jobs API uses: the jobs, and who owns each (a client key's
    tenant)."""


class Jobs:
    """Create and manage jobs; the dispatcher does the running."""

    def __init__(
        self,
        store: JobsStore,
        config: Callable[[], GatewayConfig],
        *,
        wake: Callable[[str], None] | None = None,
        cancel_call: Callable[[JobRecord], Any] | None = None,
        call_ended: Callable[[], None] | None = None,
    ) -> None:
        """``wake(slug)``: a job to dispatch now; ``cancel_call(job)``: stop the runtime's call
        of a job being cancelled; ``call_ended()``: a cancel ended a call, so its slot is free
        (the dispatcher's ``slot_freed``, as when a call finishes: a job waiting for the slot
        runs at once, not after its backoff)."""
        self._store = store
        self._config = config
        self._wake = wake
        self._cancel_call = cancel_call
        self._call_ended = call_ended

    async def create(
        self, request: JobRequest, *, idempotency_key: str | None
    ) -> tuple[JobRecord, bool]:
        """The job for this request (and whether it is new); an existing key returns its job."""
        config = self._config()
        runner = request.runner or config.default_runtime
        self._check(request, runner, config)
        if request.tenant is not None:
            return await self._create_owned(request, runner, idempotency_key, request.tenant)
        job, created = await self._create(request, runner, idempotency_key)
        if not created:
            check_same_request(job, request)
        return job, created

    async def made_before(self, request: JobRequest, *, idempotency_key: str | None) -> bool:
        """Whether ``idempotency_key`` (the request's tenant's own) already names a job, so
        that a create would only replay it."""
        key = tenant_key(request.tenant, idempotency_key)
        return key is not None and await self._store.job_by_idempotency_key(key) is not None

    async def _create_owned(
        self, request: JobRequest, runner: str, idempotency_key: str | None, tenant: str
    ) -> tuple[JobRecord, bool]:
        """Create a job ``tenant`` owns: its idempotency key is the tenant's own (two tenants'
        same key name two jobs), the ownership is stored first (a crash in between leaves an
        owner row without a job, never a job without its owner)."""
        slug = request.slug or new_slug()
        key = tenant_key(tenant, idempotency_key)
        owned = await self._store.own(JOB_KIND, slug, tenant)
        if not owned and await self._store.owner(JOB_KIND, slug) != tenant:
            raise BadRequest(f"slug {slug!r} is taken")
        try:
            job, created = await self._create(replace(request, slug=slug), runner, key)
        except BaseException:
            if owned:
                await self._store.disown(JOB_KIND, slug)
            raise
        if not created:
            if owned and job.slug != slug:
                await self._store.disown(JOB_KIND, slug)  # the key named an older job
            check_same_request(job, request)
        else:  # again: a purge of owners without a job may have run in between
            await self._store.own(JOB_KIND, job.slug, tenant)
        return job, created

    async def _create(
        self, request: JobRequest, runner: str, idempotency_key: str | None
    ) -> tuple[JobRecord, bool]:
        new = NewJob(
            slug=request.slug,
            idempotency_key=idempotency_key,
            model=request.model,
            job_class=request.cls.value,
            operation=request.operation,
            input=request.input,
            runner=runner,
            allow_external=request.allow_external,
        )
        job, created = await self._store.create_job(new)
        if created and self._wake is not None:
            self._wake(job.slug)
        return job, created

    def _check(self, request: JobRequest, runner: str, config: GatewayConfig) -> None:
        if request.slug is not None and not SLUG.match(request.slug):
            raise BadRequest("slug must be 1-128 of letters, digits, '.', '_' and '-'")
        runtimes = {r.id for r in config.runtimes}
        if runner not in runtimes:
            raise BadRequest(
                f"runner {runner!r} is not a runtime (known: {', '.join(sorted(runtimes))})"
            )
        served = {m for r in config.runtimes for m in config.runtime_models(r.id)}
        if request.model not in served:
            raise UnknownModel(f"no runtime serves model {request.model!r}")

    async def get(self, slug: str, *, tenant: str | None = None) -> JobRecord:
        """The job; :class:`JobNotFound` also when ``tenant`` (keys mode) does not own it."""
        if tenant is not None and await self._store.owner(JOB_KIND, slug) != tenant:
            raise JobNotFound(f"no job {slug!r}")
        job = await self._store.get_job(slug)
        if job is None:
            raise JobNotFound(f"no job {slug!r}")
        return job

    async def events(self, slug: str, *, tenant: str | None = None) -> list[JobEvent]:
        await self.get(slug, tenant=tenant)
        return await self._store.job_events(slug)

    async def list(
        self,
        *,
        state: str | None,
        runner: str | None,
        limit: int,
        cursor: str | None,
        tenant: str | None = None,
    ) -> JobPage:
        if state is not None and state not in JOB_STATES:
            raise BadRequest(f"state must be one of {', '.join(JOB_STATES)}; got {state!r}")
        return await self._store.list_jobs(
            state=state, runner=runner, limit=limit, cursor=cursor, tenant=tenant
        )

    async def cancel(self, slug: str, *, actor: str, tenant: str | None = None) -> JobRecord:
        """Queued → cancelled; running → the runtime's cancel first, then cancelled (and the
        call's slot is free: ``call_ended``)."""
        job = await self.get(slug, tenant=tenant)
        leased = job.state in LEASED_STATES
        if leased and self._cancel_call is not None:
            await self._cancel_call(job)
        cancelled = await self._store.cancel_job(slug, actor=actor)
        if cancelled is None:
            raise JobNotFound(f"no job {slug!r}")
        if leased and cancelled.state == "cancelled" and self._call_ended is not None:
            self._call_ended()
        return cancelled

    async def retry(self, slug: str, *, actor: str, tenant: str | None = None) -> JobRecord:
        """Re-drive a failed job from the start of its chain."""
        if tenant is not None:
            await self.get(slug, tenant=tenant)
        job = await self._store.retry_job(slug, actor=actor)
        if job is None:
            raise JobNotFound(f"no job {slug!r}")
        if job.state == "queued":  # every replica is woken, as for a new job (DESIGN §6)
            if self._wake is not None:
                self._wake(job.slug)
            await self._store.wake_replicas([job.slug])
        return job

    def __repr__(self) -> str:
        return "<Jobs>"


def tenant_key(tenant: str | None, idempotency_key: str | None) -> str | None:
    """The Idempotency-Key as the store keeps it: a tenant's own (``tenant:key``; tenant names
    hold no ``:``), so the same key in two tenants names two jobs."""
    if tenant is None or idempotency_key is None:
        return idempotency_key
    return f"{tenant}:{idempotency_key}"


def check_same_request(job: JobRecord, request: JobRequest) -> None:
    """:class:`IdempotencyKeyReused` (422) when the job an Idempotency-Key made was made by a
    different request (model, input, operation, class or allow_external differ); the runner is
    not compared (the dispatcher moves a job along its chain)."""
    stored_input = request.input if job.input_ref is not None else job.input  # held in a blob
    made = (job.model, stored_input, job.operation, job.job_class, job.allow_external)
    asked = (request.model, request.input, request.operation, request.cls.value)
    if made != (*asked, request.allow_external):
        raise IdempotencyKeyReused(
            f"this Idempotency-Key made job {job.slug} from a different request body"
        )


def job_view(job: JobRecord, *, with_input: bool = False) -> dict[str, Any]:
    """A job as the API shows it."""
    view: dict[str, Any] = {
        "slug": job.slug,
        "state": job.state,
        "runner": job.runner,
        "model": job.model,
        "class": job.job_class,
        "operation": job.operation,
        "allow_external": job.allow_external,
        "attempts": dict(job.attempts),
        "submit_count": job.submit_count,
        "rescue_count": job.rescue_count,
        "leased_by": job.leased_by,
        "lease_expires_at": _iso(job.lease_expires_at),
        "not_before": _iso(job.not_before),
        "result": job.result,
        # a result too large to keep inline: in the blob store, served by GET …/result
        "result_ref": job.result_ref,
        "error": None
        if job.error_code is None
        else {"code": job.error_code, "message": job.error_message},
        "cost_cents": job.cost_cents,
        "created_at": _iso(job.created_at),
        "updated_at": _iso(job.updated_at),
        "finished_at": _iso(job.finished_at),
    }
    if with_input:
        view["input"] = job.input
    return view


def event_view(event: JobEvent) -> dict[str, Any]:
    return {
        "id": event.id,
        "at": _iso(event.at),
        "status": event.status,
        "error_code": event.error_code,
        "runtime": event.runtime,
        "call_id": event.call_id,
        "actor": event.actor,
        "detail": event.detail,
    }


def _iso(value: Any) -> str | None:
    return None if value is None else value.isoformat()
