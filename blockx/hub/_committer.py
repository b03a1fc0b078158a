"""The committer: the hub's writer, committing operations in groups.

Every change to the hub's state is an operation handed to `do` (or `submit`).
The committer takes whatever operations are waiting, runs them in order in
one transaction (one fsync), and only then answers each of them: so the
operations that arrive while a commit is in flight all ride on the next one,
and nothing is acknowledged before it is durable. A batch that fails is rolled
back and its operations are run again one transaction each, so one bad
operation (a conflict with another hub, a bug) fails alone, with
`StoreError`; when the database itself went away, each of them fails so.
A `Meter` hears of every transaction: its size and time, or its failure.

On PostgreSQL the committer may have several connections (lanes), each
committing a batch while the others do: a batch waits on round trips and an
fsync, and the database serves several connections at once, as it does
several hubs. An operation may name a key (a worker session's instance):
the operations of one key are committed one batch after another, in the
order they came, never two at once; the others go with whichever lane is free.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, Final, Protocol, TypeVar

import attrs
import trio

from blockx.hub._store import Store, StoreError, Tx

T = TypeVar("T")

logger = logging.getLogger("blockx.hub")

MAX_BATCH: Final = 4_096


@attrs.define(eq=False)
class _Pending:
    operation: Callable[[Tx], Any]
    reply: Callable[[Any], None]
    key: str | None


class Tail(Protocol):
    """An operation run last in every transaction, and who hears its result once committed."""

    def operation(self) -> Callable[[Tx], Any]:
        """The operation for the transaction about to run (made as it starts)."""

    def committed(self, result: Any) -> None:
        """The operation's result, once its transaction is committed and answered."""


class Meter(Protocol):
    """Hears how each transaction went (the hub's metrics)."""

    def batch_committed(self, operations: int, seconds: float) -> None:
        """A transaction of `operations` (tails not counted) committed in `seconds`."""

    def batch_failed(self, error: StoreError) -> None:
        """A transaction failed with a database error and was rolled back."""


class Committer:
    """The actor. Start `run` with `nursery.start`; `use_thread=False` runs the database on
    the Trio thread (tests on a virtual clock). `lanes`: more connections to the same
    PostgreSQL database, committing beside `store`'s (closed when `run` ends)."""

    def __init__(
        self,
        store: Store,
        *,
        use_thread: bool = True,
        tails: Sequence[Tail] = (),
        meter: Meter | None = None,
        lanes: Sequence[Store] = (),
    ) -> None:
        self.store = store
        self._stores = (store, *lanes)
        self._use_thread = use_thread
        self._tails = tuple(tails)
        self._meter = meter
        self._waiting: collections.deque[_Pending] = collections.deque()
        self._busy: set[str] = set()
        """The keys of the operations of the batches in flight."""
        self._changed = trio.Event()
        """Set when an operation comes or a batch ends: a free lane looks again."""
        self._unanswered = 0
        self._idle = trio.Event()
        self._idle.set()
        self.batches = 0
        """Published: transactions committed so far."""

    def submit(
        self,
        operation: Callable[[Tx], T],
        reply: Callable[[T | StoreError], None],
        *,
        key: str | None = None,
    ) -> None:
        """Run `operation` in the next batch (after every operation of `key` submitted
        before it); `reply` gets its result once committed."""
        self._waiting.append(_Pending(operation=operation, reply=reply, key=key))
        self._changed.set()
        if self._unanswered == 0:
            self._idle = trio.Event()
        self._unanswered += 1

    async def idle(self) -> None:
        """Until every operation submitted so far is committed and answered."""
        await self._idle.wait()

    async def do(
        self, operation: Callable[[Tx], T], *, queued: Callable[[], None] | None = None
    ) -> T:
        """Run `operation` in the next batch and wait until it is committed. `queued` is
        called once it waits for its batch: what `queued` submits may join that batch."""
        done = trio.Event()
        results: list[T | StoreError] = []

        def reply(result: T | StoreError) -> None:
            results.append(result)
            done.set()

        self.submit(operation, reply)
        if queued is not None:
            queued()
        await done.wait()
        result = results[0]
        if isinstance(result, StoreError):
            raise result
        return result

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            async with trio.open_nursery() as lanes:
                for store in self._stores:
                    lanes.start_soon(self._lane, store)
                task_status.started()
        finally:
            for store in self._stores[1:]:
                store.close()

    def _take(self) -> list[_Pending]:
        """The operations a free lane commits next: those waiting, in order, but for the
        operations of keys a batch in flight holds (they wait for it)."""
        batch: list[_Pending] = []
        kept: collections.deque[_Pending] = collections.deque()
        while self._waiting and len(batch) < MAX_BATCH:
            pending = self._waiting.popleft()
            if pending.key is not None and pending.key in self._busy:
                kept.append(pending)
            else:
                batch.append(pending)
        for pending in batch:
            if pending.key is not None:
                self._busy.add(pending.key)
        self._waiting.extendleft(reversed(kept))
        return batch

    async def _lane(self, store: Store) -> None:
        while True:
            batch = self._take()
            if not batch:
                if self._changed.is_set():  # seen: wait for the next change
                    self._changed = trio.Event()
                await self._changed.wait()
                continue
            results, tail_results = await self._commit(store, [p.operation for p in batch])
            self.batches += 1
            self._busy.difference_update(p.key for p in batch if p.key is not None)
            self._changed.set()
            for pending, result in zip(batch, results, strict=True):
                pending.reply(result)
            self._unanswered -= len(batch)
            if self._unanswered == 0:
                self._idle.set()
            for each in tail_results:
                for tail, result in zip(self._tails, each, strict=True):
                    tail.committed(result)

    async def _commit(
        self, store: Store, operations: list[Callable[[Tx], Any]]
    ) -> tuple[list[Any], list[list[Any]]]:
        """Each operation's result, and each transaction's tails' results."""
        tail_results: list[list[Any]] = []
        try:
            return await self._run_batch(store, operations, tail_results), tail_results
        except Exception as error:
            if len(operations) == 1:
                return [self._failed(error)], tail_results
        results = []
        for operation in operations:
            try:
                results.extend(await self._run_batch(store, [operation], tail_results))
            except Exception as error:
                results.append(self._failed(error))
        return results, tail_results

    async def _run_batch(
        self, store: Store, operations: list[Callable[[Tx], Any]], tail_results: list[list[Any]]
    ) -> list[Any]:
        count = len(operations)
        operations = [*operations, *(tail.operation() for tail in self._tails)]
        started_s = time.perf_counter()
        try:
            results = await self._transaction(store, operations)
        except StoreError as error:
            if self._meter is not None:
                self._meter.batch_failed(error)
            raise
        if self._meter is not None:
            self._meter.batch_committed(count, time.perf_counter() - started_s)
        tail_results.append(results[count:])
        del results[count:]
        return results

    async def _transaction(self, store: Store, operations: list[Callable[[Tx], Any]]) -> list[Any]:
        if not self._use_thread:
            return store.run_batch(operations)
        if (now := store.run_batch_now(operations)) is not None:
            # SQLite: run here, where the rest of the hub's Python runs anyway (one
            # interpreter lock); a hand-off to a thread and back costs more than the fsync.
            return now
        # Not abandoned on cancellation: a commit that started is let finish.
        return await trio.to_thread.run_sync(store.run_batch, operations)

    def _failed(self, error: Exception) -> StoreError:
        if isinstance(error, StoreError):
            return error
        logger.error("hub: an operation failed", exc_info=error)
        return StoreError(url=self.store.name, reason=f"an operation failed: {error!r}")
