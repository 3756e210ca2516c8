"""Every error gpugate raises on purpose, in one tree.

Each class carries a stable ``code`` (the contract clients program against) and its docstring is
its default message. HTTP status codes are not here: the web layer maps classes to statuses in
one table (``gpugate.web.errors``), looked up through this hierarchy.

    GpugateError
    ├── ConfigError                    the configuration is invalid (carries every problem)
    ├── StoreError                     the store failed
    │   ├── StoreUnavailable           the store cannot be reached
    │   ├── MigrationError             a migration could not be applied
    │   └── BlobError                  BLOB_ERROR: the blob store failed
    │       └── BlobNotFound           BLOB_NOT_FOUND: no blob under that key
    ├── ListenError                    the listen address cannot be bound
    ├── ScrapeError                    SCRAPE_FAILED: an exporter's answer is not exposition text
    │   ├── NoGpuSeries                SCRAPE_NO_GPUS: it parses, but holds no DCGM GPU series
    │   └── NoEngineSeries             SCRAPE_NO_ENGINE: it parses, but no vLLM/SGLang/TEI series
    ├── ClientError                    the request is wrong; retrying it unchanged will not help
    │   ├── BadRequest                 BAD_REQUEST
    │   ├── PayloadTooLarge            PAYLOAD_TOO_LARGE
    │   ├── NoSuchRoute                NOT_FOUND: no route has this path
    │   ├── MethodNotAllowed           METHOD_NOT_ALLOWED: the route takes other methods
    │   ├── Unauthorized               UNAUTHORIZED
    │   ├── ModelNotAllowed            MODEL_NOT_ALLOWED: the client key may not use the model
    │   ├── RunnerNotAllowed           RUNNER_NOT_ALLOWED: the client key may not use the runner
    │   ├── KeyNotFound                KEY_NOT_FOUND: no client key has this id
    │   ├── KeyRevoked                 KEY_REVOKED: a revoked key cannot be given a new secret
    │   ├── CsrfRejected               CSRF_REJECTED: a console action without its session's token
    │   ├── TooManyAttempts            TOO_MANY_ATTEMPTS: too many wrong credentials from a client
    │   ├── UnknownModel               UNKNOWN_MODEL
    │   ├── UnknownUpstream            UNKNOWN_UPSTREAM
    │   ├── ExternalUpstreamForbidden  EXTERNAL_UPSTREAM_FORBIDDEN
    │   ├── IdempotencyConflict        IDEMPOTENCY_CONFLICT
    │   ├── IdempotencyKeyReused       IDEMPOTENCY_KEY_REUSED
    │   ├── JobNotFound                JOB_NOT_FOUND
    │   ├── JobNotCompleted            JOB_NOT_COMPLETED: the job has no result (yet)
    │   ├── FileNotFound               FILE_NOT_FOUND: no Batch API file has this id
    │   ├── BatchNotFound              BATCH_NOT_FOUND: no Batch API batch has this id
    │   ├── UnknownRuntime             UNKNOWN_RUNTIME
    │   ├── UnknownGpu                 UNKNOWN_GPU: no exporter has shown a GPU with that id
    │   ├── UnknownConfigVersion       UNKNOWN_CONFIG_VERSION
    │   ├── WrongRuntime               WRONG_RUNTIME: a worker's secret is not the lease holder's
    │   └── LeaseTokenStale            LEASE_TOKEN_STALE: a worker's lease token is not current
    ├── Refused                        admission said no for now; retry later (Retry-After)
    │   ├── GpuSaturated               GPU_SATURATED
    │   ├── QueueTimeout               QUEUE_TIMEOUT
    │   ├── QueueFull                  QUEUE_FULL
    │   ├── NoHealthyUpstream          NO_HEALTHY_UPSTREAM
    │   ├── KeyLimited                 a client key's limit (429, Retry-After)
    │   │   ├── RateLimited            RATE_LIMITED: requests per minute
    │   │   ├── TokenLimited           TOKEN_LIMITED: tokens per minute
    │   │   ├── ConcurrencyLimited     CONCURRENCY_LIMITED: requests in flight
    │   │   └── BudgetExceeded         BUDGET_EXCEEDED: the daily tokens or cents
    │   ├── GatewayOverloaded          GATEWAY_OVERLOADED: the gateway ran out of file descriptors
    │   └── ShuttingDown               SHUTTING_DOWN: the replica stops; another will answer
    ├── UpstreamError                  the upstream failed us
    │   ├── UpstreamTimeout            UPSTREAM_TIMEOUT
    │   └── UpstreamUnreachable        UPSTREAM_UNREACHABLE
    └── JobError                       a job could not be dispatched or run
        ├── StaleLease                 STALE_LEASE: another dispatcher or the reaper owns it now
        ├── ChainExhausted             CHAIN_EXHAUSTED: every runtime of the chain failed it
        ├── LeaseLost                  LEASE_LOST: rescued more than max_rescues times
        ├── AtCapacity                 AT_CAPACITY: every candidate is at max_concurrency
        └── RuntimeFailure             RUNTIME_FAILED: a runtime did not take a call
            ├── RuntimeBusy            RUNTIME_BUSY         retryable (429, at capacity)
            ├── RuntimeUnreachable     RUNTIME_UNREACHABLE  retryable
            │   └── RuntimeRefused     RUNTIME_UNREACHABLE  nothing listens there (refused)
            ├── RuntimeTimeout         RUNTIME_TIMEOUT      retryable
            ├── RuntimeRejected        RUNTIME_REJECTED     not retryable
            └── RuntimeAuthFailed      RUNTIME_AUTH_FAILED  not retryable (401/403)
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Tried:
    """What a request's tries came to when it ended in one of our errors after an upstream was
    tried: the last upstream tried (its id), the tries made, the gateway's own time."""

    upstream: str
    attempts: int
    overhead_s: float


class GpugateError(Exception):
    """gpugate failed."""

    code = "INTERNAL"
    #: The message is for the operator's log (it may name hosts, users, paths): clients and
    #: unauthenticated probes get :attr:`public_message`, the class's docstring, instead.
    internal = False
    #: Set by the sync path when this error ends a request after upstreams were tried: the
    #: answer's ``X-Gateway-*`` headers and its ``gateway_requests_total`` name them.
    tried: Tried | None = None

    def __init__(self, message: str | None = None, *, retry_after_s: float | None = None) -> None:
        self.message = message or (type(self).__doc__ or self.code).strip()
        self.retry_after_s = retry_after_s
        super().__init__(self.message)

    @property
    def public_message(self) -> str:
        """What someone outside may read: the message, or for an internal error its class's
        docstring (the code still says which error it was)."""
        return (type(self).__doc__ or self.code).strip() if self.internal else self.message


@dataclass(frozen=True, slots=True)
class ConfigProblem:
    """One thing wrong with a configuration: where (a dotted key path and a line) and what."""

    path: str
    message: str
    line: int | None = None

    def __str__(self) -> str:
        where = self.path or "(document)"
        suffix = f" (line {self.line})" if self.line is not None else ""
        return f"{where}: {self.message}{suffix}"


class ConfigError(GpugateError):
    """The configuration is invalid."""

    code = "CONFIG_INVALID"

    def __init__(self, problems: list[ConfigProblem], *, source: str | None = None) -> None:
        self.problems = problems
        self.source = source
        head = f"{source}: " if source else ""
        super().__init__(head + "; ".join(str(p) for p in problems))


class StoreError(GpugateError):
    """The store failed."""

    code = "STORE_ERROR"
    internal = True  # its messages name the database's host, user, file (issue #15 finding 8)


class StoreUnavailable(StoreError):
    """The store cannot be reached."""

    code = "STORE_UNAVAILABLE"


class MigrationError(StoreError):
    """A store migration could not be applied."""

    code = "MIGRATION_FAILED"


class BlobError(StoreError):
    """The blob store failed."""

    code = "BLOB_ERROR"


class BlobNotFound(BlobError):
    """No blob is stored under that key."""

    code = "BLOB_NOT_FOUND"


class ListenError(GpugateError):
    """The listen address cannot be bound."""

    code = "LISTEN_FAILED"


class ScrapeError(GpugateError):
    """The exporter's answer is not Prometheus text exposition (garbage or truncated)."""

    code = "SCRAPE_FAILED"


class NoGpuSeries(ScrapeError):
    """The scrape parses, but holds no DCGM GPU series: not a dcgm-exporter, or no GPU on it."""

    code = "SCRAPE_NO_GPUS"


class NoEngineSeries(ScrapeError):
    """The scrape parses, but holds no model-server series (vLLM, SGLang or TEI) to route on."""

    code = "SCRAPE_NO_ENGINE"


class ClientError(GpugateError):
    """The request is wrong; retrying it unchanged will not help."""

    code = "BAD_REQUEST"


class BadRequest(ClientError):
    """The request is malformed."""

    code = "BAD_REQUEST"


class PayloadTooLarge(ClientError):
    """The request body is larger than this gateway accepts."""

    code = "PAYLOAD_TOO_LARGE"


class NoSuchRoute(ClientError):
    """No route of the gateway has this path."""

    code = "NOT_FOUND"


class MethodNotAllowed(ClientError):
    """The route does not take this method."""

    code = "METHOD_NOT_ALLOWED"


class Unauthorized(ClientError):
    """Missing or wrong credentials."""

    code = "UNAUTHORIZED"


class ModelNotAllowed(ClientError):
    """This client key may not use that model."""

    code = "MODEL_NOT_ALLOWED"


class RunnerNotAllowed(ClientError):
    """This client key may not use that runner."""

    code = "RUNNER_NOT_ALLOWED"


class KeyNotFound(ClientError):
    """No client key has this id."""

    code = "KEY_NOT_FOUND"


class KeyRevoked(ClientError):
    """The key is revoked: a new secret for it would never work (create a new key)."""

    code = "KEY_REVOKED"


class CsrfRejected(ClientError):
    """A console action came without the CSRF token of its session."""

    code = "CSRF_REJECTED"


class TooManyAttempts(ClientError):
    """Too many wrong credentials from this client: wait before trying again."""

    code = "TOO_MANY_ATTEMPTS"


class UnknownModel(ClientError):
    """No upstream serves this model."""

    code = "UNKNOWN_MODEL"


class UnknownUpstream(ClientError):
    """No upstream has this id."""

    code = "UNKNOWN_UPSTREAM"


class ExternalUpstreamForbidden(ClientError):
    """The request may not leave the building, and only external upstreams could serve it."""

    code = "EXTERNAL_UPSTREAM_FORBIDDEN"


class HeadersTooLarge(ClientError):
    """The request line and headers are larger, or more, than this gateway accepts."""

    code = "HEADERS_TOO_LARGE"


class RequestTimeout(ClientError):
    """The client was too slow sending its request (headers or body)."""

    code = "REQUEST_TIMEOUT"


class RawForbidden(ClientError):
    """This upstream is not reachable through /u/ for this method and path (its `raw:` opt-in)."""

    code = "RAW_FORBIDDEN"


class IdempotencyConflict(ClientError):
    """A request with this Idempotency-Key is still in flight."""

    code = "IDEMPOTENCY_CONFLICT"


class IdempotencyKeyReused(ClientError):
    """This Idempotency-Key was used with a different request body."""

    code = "IDEMPOTENCY_KEY_REUSED"


class Refused(GpugateError):
    """Admission refused the request for now; retry later."""

    code = "REFUSED"


class GpuSaturated(Refused):
    """The GPUs behind every candidate upstream are saturated; batch traffic is shed."""

    code = "GPU_SATURATED"


class QueueTimeout(Refused):
    """The request waited in the admission queue longer than queue_timeout_s."""

    code = "QUEUE_TIMEOUT"


class QueueFull(Refused):
    """The admission queue of the upstream is full."""

    code = "QUEUE_FULL"


class ShuttingDown(Refused):
    """This replica is shutting down and its grace period is over; retry (another replica
    answers)."""

    code = "SHUTTING_DOWN"


class TooManyConnections(Refused):
    """This replica holds as many client connections as it accepts (server.max_connections)."""

    code = "TOO_MANY_CONNECTIONS"


class NoHealthyUpstream(Refused):
    """No healthy upstream serves this model right now."""

    code = "NO_HEALTHY_UPSTREAM"


class KeyLimited(Refused):
    """The client key is over one of its limits; retry after Retry-After."""

    code = "KEY_LIMITED"


class RateLimited(KeyLimited):
    """The client key is over its requests per minute."""

    code = "RATE_LIMITED"


class TokenLimited(KeyLimited):
    """The client key is over its tokens per minute."""

    code = "TOKEN_LIMITED"


class ConcurrencyLimited(KeyLimited):
    """The client key has as many requests in flight as it may."""

    code = "CONCURRENCY_LIMITED"


class BudgetExceeded(KeyLimited):
    """The client key has used its daily tokens or cents."""

    code = "BUDGET_EXCEEDED"


LIMIT_ERRORS: dict[str, type[KeyLimited]] = {
    cls.code: cls for cls in (RateLimited, TokenLimited, ConcurrencyLimited, BudgetExceeded)
}


class GatewayOverloaded(Refused):
    """The gateway is overloaded (it ran out of file descriptors); retry shortly."""

    code = "GATEWAY_OVERLOADED"


class UpstreamError(GpugateError):
    """The upstream failed."""

    code = "UPSTREAM_ERROR"

    def __init__(
        self,
        message: str | None = None,
        *,
        connect_failed: bool = False,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(message, retry_after_s=retry_after_s)
        #: True when no byte reached the upstream (refused, connect timeout): safe to retry.
        self.connect_failed = connect_failed


class UpstreamTimeout(UpstreamError):
    """The upstream did not answer in time."""

    code = "UPSTREAM_TIMEOUT"


class UpstreamUnreachable(UpstreamError):
    """The upstream could not be reached."""

    code = "UPSTREAM_UNREACHABLE"


class JobNotFound(ClientError):
    """No job has this slug."""

    code = "JOB_NOT_FOUND"


class FileNotFound(ClientError):
    """No file (Batch API) has this id."""

    code = "FILE_NOT_FOUND"


class BatchNotFound(ClientError):
    """No batch (Batch API) has this id."""

    code = "BATCH_NOT_FOUND"


class UnknownRuntime(ClientError):
    """No runtime with that id is configured."""

    code = "UNKNOWN_RUNTIME"


class UnknownGpu(ClientError):
    """No exporter has shown a GPU with that id (nothing to clear)."""

    code = "UNKNOWN_GPU"


class UnknownConfigVersion(ClientError):
    """No stored gateway config version has that number."""

    code = "UNKNOWN_CONFIG_VERSION"


class WrongRuntime(ClientError):
    """This secret belongs to another runtime than the one holding the job's lease."""

    code = "WRONG_RUNTIME"


class LeaseTokenStale(ClientError):
    """The lease token is not the job's current one: the job was taken back, walked on or
    finished, and this worker's call no longer counts."""

    code = "LEASE_TOKEN_STALE"


class JobNotCompleted(ClientError):
    """The job has no result: it is not completed."""

    code = "JOB_NOT_COMPLETED"


class JobError(GpugateError):
    """A job could not be dispatched or run."""

    code = "JOB_ERROR"


class StaleLease(JobError):
    """The lease token is no longer the job's: another dispatcher or the reaper owns it now."""

    code = "STALE_LEASE"


class ChainExhausted(JobError):
    """Every runtime of the fallback chain was tried or skipped, and none took the job."""

    code = "CHAIN_EXHAUSTED"


class LeaseLost(JobError):
    """The job's lease was lost (its holder went quiet) more often than max_rescues allows."""

    code = "LEASE_LOST"


class AtCapacity(JobError):
    """Every candidate runtime is at its max_concurrency; the job waits for a free slot."""

    code = "AT_CAPACITY"


class RuntimeFailure(JobError):
    """A runtime did not take the call.

    ``retryable`` (a class attribute) says whether trying the same runtime again may help:
    the dispatcher retries a retryable failure once in place, then walks to the next runtime.
    """

    code = "RUNTIME_FAILED"
    retryable = False


class RuntimeBusy(RuntimeFailure):
    """The runtime is busy (429 or at its capacity); try again shortly."""

    code = "RUNTIME_BUSY"
    retryable = True


class RuntimeUnreachable(RuntimeFailure):
    """The runtime could not be reached."""

    code = "RUNTIME_UNREACHABLE"
    retryable = True


class RuntimeRefused(RuntimeUnreachable):
    """Nothing listens at the runtime's address (connection refused): no process there runs
    a call, so none of its calls is running."""


class RuntimeTimeout(RuntimeFailure):
    """The runtime did not answer in time."""

    code = "RUNTIME_TIMEOUT"
    retryable = True


class RuntimeRejected(RuntimeFailure):
    """The runtime refused the call; the same call will be refused again."""

    code = "RUNTIME_REJECTED"


class RuntimeAuthFailed(RuntimeFailure):
    """The runtime refused our credentials (401/403)."""

    code = "RUNTIME_AUTH_FAILED"
