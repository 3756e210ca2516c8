"""The durable state of a gateway, behind one interface with a SQLite and a PostgreSQL backend.

Its top level holds the interface (:class:`Store`, written once for both backends) and its
values; the services import it without loading a driver.
``gpugate.store.factory.open_store(dsn, clock=...)`` (used by the composition root) picks the
backend from the DSN and returns the store unopened: ``await store.open()`` connects,
``await store.migrate()`` brings the schema up to date.
"""

from __future__ import annotations

from gpugate.store.base import (
    CONFIG_SAVED,
    CONFIG_SEEDED,
    CONFIG_SUBJECT,
    AuditEvent,
    AuditRecord,
    ConfigVersion,
    IdemBegin,
    IdemRecord,
    InFlight,
    Mismatch,
    Replay,
    Started,
    request_fingerprint,
)
from gpugate.store.jobs_base import (
    DEFAULT_OPERATION,
    JOB_CLASSES,
    JOB_EVENT_STATUSES,
    JOB_STATES,
    LEASE_LOST,
    LEASED_STATES,
    TERMINAL_STATES,
    JobEvent,
    JobPage,
    JobRecord,
    JobStore,
    NewJob,
    check_slug,
)
from gpugate.store.sql_store import Store

__all__ = [
    "CONFIG_SAVED",
    "CONFIG_SEEDED",
    "CONFIG_SUBJECT",
    "DEFAULT_OPERATION",
    "JOB_CLASSES",
    "JOB_EVENT_STATUSES",
    "JOB_STATES",
    "LEASED_STATES",
    "LEASE_LOST",
    "TERMINAL_STATES",
    "AuditEvent",
    "AuditRecord",
    "ConfigVersion",
    "IdemBegin",
    "IdemRecord",
    "InFlight",
    "JobEvent",
    "JobPage",
    "JobRecord",
    "JobStore",
    "Mismatch",
    "NewJob",
    "Replay",
    "Started",
    "Store",
    "check_slug",
    "request_fingerprint",
]
