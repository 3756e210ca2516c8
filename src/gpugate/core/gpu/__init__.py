"""GPU health, pure: dcgm-exporter samples → readings → per-GPU state → verdicts.

* :mod:`.dcgm` — samples → one :class:`~.dcgm.GpuReading` per GPU and MIG instance;
* :mod:`.xid` — the XID severity table (package data ``xid_severity.csv``, overridable);
* :mod:`.health` — per-GPU state, :func:`~.health.observe` / :func:`~.health.assess`, and the
  fleet-wide :class:`~.health.GpuFleetState` the monitor feeds and routing asks;
* :mod:`.report` — the ``gpugate gpus inspect --json`` entries.

Text → samples is :mod:`gpugate.adapters.exposition`'s job; nothing here imports a parser.
"""
