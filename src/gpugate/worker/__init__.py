"""The reference push worker (``gpugate worker``): runs pushed jobs on a home or local machine.

A separate program from the gateway: it serves the push protocol at ``/calls`` (DESIGN §3),
runs each job against a local OpenAI-compatible server, and reports to the gateway's worker
routes. It imports only gpugate's foundation (errors, logging), never the gateway's services.

* :mod:`~gpugate.worker.calls` — a call, its outcome, and the report that ends it (pure);
* :mod:`~gpugate.worker.outbox` — finished reports kept on disk until the gateway took them;
* :mod:`~gpugate.worker.links` — the worker's outbound HTTP: the gateway, the model server;
* :mod:`~gpugate.worker.worker` — the calls in flight, their reports, idle exit;
* :mod:`~gpugate.worker.server` — the ``/calls`` HTTP face and the process entry point.
"""

from gpugate.worker.worker import Worker, WorkerSettings

__all__ = ["Worker", "WorkerSettings"]
