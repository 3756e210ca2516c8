"""The durable state of a gateway, behind one interface with a SQLite and a PostgreSQL backend.

Its top level holds the interface (:class:`Store`, written once for both backends) and the
values the services use most (each also in its module); the services import it without loading
a driver. ``gpugate.store.factory.open_store(dsn, clock=...)`` (used by the composition root)
picks the backend from the DSN and returns the store unopened: ``await store.open()`` connects,
``await store.migrate()`` brings the schema up to date.
"""

from __future__ import annotations

from gpugate.core.job_states import JOB_STATES as JOB_STATES
from gpugate.core.job_states import LEASE_LOST as LEASE_LOST
from gpugate.core.job_states import JobEvent as JobEvent
from gpugate.core.job_states import JobRecord as JobRecord
from gpugate.core.job_states import NewJob as NewJob
from gpugate.store.base import CONFIG_SAVED as CONFIG_SAVED
from gpugate.store.base import CONFIG_SEEDED as CONFIG_SEEDED
from gpugate.store.base import AuditEvent as AuditEvent
from gpugate.store.base import AuditRecord as AuditRecord
from gpugate.store.base import ConfigVersion as ConfigVersion
from gpugate.store.base import InFlight as InFlight
from gpugate.store.base import Mismatch as Mismatch
from gpugate.store.base import Replay as Replay
from gpugate.store.base import Started as Started
from gpugate.store.base import request_fingerprint as request_fingerprint
from gpugate.store.jobs_sql import JobPage as JobPage
from gpugate.store.jobs_sql import JobStore as JobStore
from gpugate.store.sql_store import Store as Store
