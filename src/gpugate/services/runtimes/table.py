"""The runtimes a gateway has implementations for, by id: built from the config, followed on
every config version.

:class:`Runtimes` is the one live table the dispatcher, the reaper, the gauges and the drain
read (a read-only :class:`~collections.abc.Mapping`). It is complete when constructed — every
configured runtime that can be built is — and afterwards changes only the way it was made: when
a config version adds a runtime, or changes what a runtime's implementation was built from
(:func:`built_from_changed`), :meth:`Runtimes.follow` builds it again. A runtime that cannot be
built (a push runtime whose secret is unset) is absent, and the dispatcher's walk skips it
(``no_implementation``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping, Sequence

from gpugate.config import ModalRuntimeConfig, PushRuntimeConfig, RuntimeConfig
from gpugate.services.runtimes.base import Runtime

log = logging.getLogger("gpugate")

#: Builds the implementation of one configured runtime; None: it cannot be built now.
Build = Callable[[RuntimeConfig], Runtime | None]


class Runtimes(Mapping[str, Runtime]):
    """Runtime id → its implementation; see the module docstring."""

    __slots__ = ("_build", "_by_id")

    def __init__(self, entries: Sequence[RuntimeConfig], build: Build) -> None:
        self._build = build
        self._by_id: dict[str, Runtime] = {}
        for entry in entries:
            if (runtime := build(entry)) is not None:
                self._by_id[entry.id] = runtime

    def __getitem__(self, runtime_id: str) -> Runtime:
        return self._by_id[runtime_id]

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_id)

    def __len__(self) -> int:
        return len(self._by_id)

    def follow(self, before: Sequence[RuntimeConfig], after: Sequence[RuntimeConfig]) -> None:
        """A new config version (``after``) replaced ``before``: build what it adds and what it
        changed the implementation of (calls in flight on a replaced one are then answered by
        the new one); what stays as it was is kept, and a runtime that leaves the config stays
        built (its calls in flight still report) but gets no new work (the walk reads the
        config)."""
        previous = {entry.id: entry for entry in before}
        for entry in after:
            old = previous.get(entry.id)
            fresh = entry.id not in self._by_id
            if not fresh and (old is None or not built_from_changed(old, entry)):
                continue
            if (built := self._build(entry)) is not None:
                self._by_id[entry.id] = built
            elif not fresh:
                log.warning(
                    "runtime %s: kept as it was; its new settings cannot be built", entry.id
                )

    def __repr__(self) -> str:
        return f"<Runtimes {', '.join(self._by_id) or 'none'}>"


def built_from_changed(old: RuntimeConfig, new: RuntimeConfig) -> bool:
    """Whether what a runtime's implementation was built from changed (models, enabled,
    max_concurrency and budgets are read live from the config instead)."""
    if old.kind != new.kind:
        return True
    rate_old = old.budget.cents_per_second if old.budget else None
    rate_new = new.budget.cents_per_second if new.budget else None
    if isinstance(old, PushRuntimeConfig) and isinstance(new, PushRuntimeConfig):
        return old.push != new.push or rate_old != rate_new
    if isinstance(old, ModalRuntimeConfig) and isinstance(new, ModalRuntimeConfig):
        return old.modal != new.modal or rate_old != rate_new
    return False
