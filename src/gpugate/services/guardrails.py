"""Budgets: settling the spend ledger, today's spend per runtime, the soft cap and over budget.

The dispatcher reserves each call's estimated cost in the store before the submit (the atomic
check, :meth:`~gpugate.store.ledger.LedgerStore.reserve_call`); this service does the rest:

* :meth:`Guardrails.tick` settles the entries of calls that ended (the reported cost, or the
  duration x ``cents_per_second``; 0 for a call that failed or was lost), reads every runtime's
  spend of the last :data:`DAYS` UTC days, and for each runtime with a budget sets its gauges and
  raises the soft-cap alert once per day (an audit event, marked in the store so that replicas
  raise it once between them);
* :meth:`Guardrails.over_budget` is the set the runtime views mark ``over_budget`` (skipped in the
  walk without a reservation's round trip);
* :meth:`Guardrails.spend` is a runtime's spend as the admin API shows it.

It ticks every ``poll_s`` and, sooner, when woken (:meth:`wake`: a call finished), so a settled
cost shows within moments of the completion. A runtime without a budget is never read or written.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING

from gpugate.clock import sleep_or_wake
from gpugate.core.budget import BUDGET_FACTOR, over_budget
from gpugate.errors import GpugateError
from gpugate.store.ledger import LedgerEntry, SpendDay

if TYPE_CHECKING:
    from collections.abc import Callable
    from datetime import date

    from gpugate.clock import Clock
    from gpugate.config import GatewayConfig
    from gpugate.config.runtime import BudgetConfig
    from gpugate.metrics import Metrics
    from gpugate.store.ledger import LedgerStore

log = logging.getLogger("gpugate.guardrails")

DAYS = 14
"""How many UTC days of spend a runtime's detail shows (the console's chart)."""

SETTLE_PAGE = 500
"""How many ended calls one settlement transaction takes."""

LEDGER_SHOWN = 50
"""How many of a runtime's latest ledger entries its detail shows."""


@dataclass(frozen=True, slots=True)
class Spend:
    """A runtime's spend as an operator sees it; ``daily_cents`` None: no budget."""

    daily_cents: float | None
    today_cents: float | None
    over_budget: bool
    soft_cap: bool
    days: list[SpendDay] = field(default_factory=list)
    ledger: list[LedgerEntry] = field(default_factory=list)


class Guardrails:
    """Settles the ledger and watches each budget; see the module docstring."""

    def __init__(
        self,
        store: LedgerStore,
        config: Callable[[], GatewayConfig],
        metrics: Metrics,
        clock: Clock,
        *,
        poll_s: float,
    ) -> None:
        self._store = store
        self._config = config
        self._metrics = metrics
        self._clock = clock
        self._poll_s = poll_s
        self._woken = asyncio.Event()
        self.today: dict[str, float] = {}  # runtime -> cents spent today (UTC), budgeted only
        self.settled = 0
        #: (runtime, day) whose soft cap is marked in the store: not written again that day.
        self._soft_marked: set[tuple[str, date]] = set()

    def budgets(self) -> dict[str, BudgetConfig]:
        """Every configured runtime with a budget."""
        return {r.id: r.budget for r in self._config().runtimes if r.budget is not None}

    def over_budget(self) -> frozenset[str]:
        """The runtimes whose spend today reached ``2 x daily_cents``, as last read."""
        return frozenset(
            rid for rid, budget in self.budgets().items() if _over(self.today.get(rid, 0.0), budget)
        )

    def wake(self) -> None:
        """A call finished: settle soon, not at the next poll."""
        self._woken.set()

    async def tick(self) -> int:
        """Settle what ended, re-read today's spend, raise the alerts; entries settled."""
        budgets = self.budgets()
        if not budgets:
            return 0
        settled = 0
        while (done := await self._store.settle_ledger(limit=SETTLE_PAGE)) > 0:
            settled += done
            if done < SETTLE_PAGE:
                break
        self.settled += settled
        today = self._clock.now().date()
        days = await self._store.spend_days(today)
        self.today = {
            rid: sum(d.cents for d in days.get(rid, []) if d.day == today) for rid in budgets
        }
        self._soft_marked = {marked for marked in self._soft_marked if marked[1] == today}
        for rid, budget in budgets.items():
            await self._watch(rid, budget, today)
        return settled

    async def _watch(self, runtime: str, budget: BudgetConfig, today: date) -> None:
        spent = self.today.get(runtime, 0.0)
        soft = spent >= budget.daily_cents
        self._metrics.runtime_spend_today.labels(runtime).set(spent)
        self._metrics.runtime_soft_cap.labels(runtime).set(1 if soft else 0)
        self._metrics.runtime_over_budget.labels(runtime).set(1 if _over(spent, budget) else 0)
        if not soft or (runtime, today) in self._soft_marked:
            return
        marked = await self._store.mark_soft_cap(runtime, today, budget.daily_cents)
        self._soft_marked.add((runtime, today))  # by this call, or already (maybe by a replica)
        if marked:
            log.warning(
                "runtime %s reached its soft cap: %.2f of %.2f cents today (over budget at %.2f)",
                runtime,
                spent,
                budget.daily_cents,
                BUDGET_FACTOR * budget.daily_cents,
            )

    async def run(self) -> None:
        """Tick every ``poll_s``, and when woken; a failed tick is logged and tried again."""
        while True:
            try:
                await self.tick()
            except GpugateError as exc:
                log.warning("cannot settle the spend ledger: %s", exc.message)
            self._woken.clear()
            await sleep_or_wake(self._clock, self._woken, self._poll_s)

    async def spend(self, runtime: str, *, entries: int = LEDGER_SHOWN) -> Spend:
        """``runtime``'s spend: today, the last :data:`DAYS` days, its latest ledger entries."""
        budget = self.budgets().get(runtime)
        if budget is None:
            return Spend(None, None, over_budget=False, soft_cap=False)
        today = self._clock.now().date()
        since = today - timedelta(days=DAYS - 1)
        days = (await self._store.spend_days(since)).get(runtime, [])
        by_day = {d.day: d.cents for d in days}
        chart = [
            SpendDay(day, by_day.get(day, 0.0))
            for day in (since + timedelta(days=n) for n in range(DAYS))
        ]
        spent = by_day.get(today, 0.0)
        return Spend(
            budget.daily_cents,
            spent,
            over_budget=_over(spent, budget),
            soft_cap=spent >= budget.daily_cents,
            days=chart,
            ledger=await self._store.ledger_entries(runtime, limit=entries),
        )

    def __repr__(self) -> str:
        return f"<Guardrails budgets={len(self.budgets())} settled={self.settled}>"


def _over(spent: float, budget: BudgetConfig) -> bool:
    """Whether ``spent`` cents in a day is over ``budget`` (the rule of :mod:`gpugate.core.budget`,
    which the store's reservation applies too)."""
    return over_budget(spent, budget.daily_cents)
