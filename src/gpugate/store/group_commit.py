"""Group commit: the writes that pile up while one is in flight go together in the next one.

A job's lifecycle is four write transactions (create, claim, submit, complete), and under load
hundreds of them arrive at once: one transaction each spent most of the gateway's time on
transaction overhead (SQLite: a hop to the store's thread and a commit each; PostgreSQL:
BEGIN, the statements and COMMIT, a round trip each). :class:`GroupCommit` writes the first
write at once — an idle job waits for nothing, there is no timer — and everything that arrives
while that transaction runs in the next one, so the batch grows exactly with the load.

``overlap`` lets that many flushes run at once (PostgreSQL: 2, each on its own connection): a
write that arrives while one batch is in flight goes at once in a second one instead of waiting
for the first to commit — a completion waits for no unrelated batch (the at-least-once window,
``docs/jobs.md``). Two batches touching one row are ordered by the database's row lock; writes
that must be ordered (one caller's, each awaited) never meet in two batches.

Each caller still gets its own answer (or its own exception): the backend's ``flush`` returns
one outcome per item, an exception for an item that failed alone. When a batch's transaction
fails as a whole with a :class:`~gpugate.errors.StoreError` (rolled back: a constraint, a bad
value), each item is written again alone, so the one at fault fails and the others do not; a
:class:`~gpugate.errors.StoreUnavailable` (the store is gone, the commit's fate may be unknown)
reaches every caller, as it would have without the batch.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Generic, TypeVar

from gpugate.errors import StoreError, StoreUnavailable

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Sequence

Item = TypeVar("Item")
R = TypeVar("R")


class GroupCommit(Generic[Item, R]):
    """Runs ``flush`` on batches of items: ``overlap`` flushes at a time (one unless told),
    at most ``max_batch`` items each."""

    def __init__(
        self,
        flush: Callable[[Sequence[Item]], Awaitable[Sequence[R | Exception]]],
        *,
        max_batch: int = 256,
        overlap: int = 1,
    ) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be at least 1, got {max_batch}")
        if overlap < 1:
            raise ValueError(f"overlap must be at least 1, got {overlap}")
        self._flush = flush
        self._max_batch = max_batch
        self._overlap = overlap
        self._queue: list[tuple[Item, asyncio.Future[R]]] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self.flushes = 0
        self.items = 0

    async def submit(self, item: Item) -> R:
        """Write ``item`` in the next flush (at once when fewer than ``overlap`` are in flight);
        its outcome."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[R] = loop.create_future()
        self._queue.append((item, future))
        if len(self._tasks) < self._overlap:
            task = loop.create_task(self._drain(), name="gpugate.store.group_commit")
            self._tasks.add(task)
        return await future

    async def _drain(self) -> None:
        try:
            while self._queue:
                batch = self._queue[: self._max_batch]
                del self._queue[: self._max_batch]
                await self._run(batch)
        finally:
            self._tasks.discard(asyncio.current_task())
            if not self._tasks:  # else another drain takes what is left
                self._fail_left()

    def _fail_left(self) -> None:
        left, self._queue = self._queue, []
        for _, future in left:  # only when the drain itself was cancelled (shutdown)
            if not future.done():
                future.set_exception(StoreUnavailable("the store closed before this write"))

    async def _run(self, batch: list[tuple[Item, asyncio.Future[R]]]) -> None:
        self.flushes += 1
        self.items += len(batch)
        try:
            outcomes = await self._outcomes([item for item, _ in batch])
        except BaseException as exc:
            for _, future in batch:
                if not future.done():
                    future.set_exception(StoreUnavailable(f"the write was interrupted: {exc!r}"))
            raise
        for (_, future), outcome in zip(batch, outcomes, strict=True):
            if future.done():  # the caller went away; the write happened regardless
                continue
            if isinstance(outcome, Exception):
                future.set_exception(outcome)
            else:
                future.set_result(outcome)

    async def _outcomes(self, items: list[Item]) -> Sequence[R | Exception]:
        try:
            return await self._flush(items)
        except StoreUnavailable as exc:
            return [exc] * len(items)
        except StoreError as exc:
            if len(items) == 1:
                return [exc]
        except Exception as exc:  # noqa: BLE001 - the caller's exception, handed to each caller
            return [exc] * len(items)
        outcomes: list[R | Exception] = []
        for item in items:  # the batch rolled back: find the one at fault
            outcomes.extend(await self._outcomes([item]))
        return outcomes

    def __repr__(self) -> str:
        busy = f" flushing={len(self._tasks)}" if self._tasks else ""
        return f"<GroupCommit flushes={self.flushes} items={self.items}{busy}>"
