"""The committer: the hub's one writer, committing operations in groups.

Every change to the hub's state is an operation handed to `do` (or `submit`).
The committer takes whatever operations are waiting, runs them in order in
one transaction (one fsync), and only then answers each of them: so the
operations that arrive while a commit is in flight all ride on the next one,
and nothing is acknowledged before it is durable. A batch that fails is rolled
back and its operations are run again one transaction each, so one bad
operation (a conflict with another hub, a bug) fails alone, with
`StoreError`; when the database itself went away, each of them fails so.
A `Meter` hears of every transaction: its size and time, or its failure.
"""

from __future__ import annotations

import logging
import math
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
    the Trio thread (tests on a virtual clock)."""

    def __init__(
        self,
        store: Store,
        *,
        use_thread: bool = True,
        tails: Sequence[Tail] = (),
        meter: Meter | None = None,
    ) -> None:
        self.store = store
        self._use_thread = use_thread
        self._tails = tuple(tails)
        self._meter = meter
        self._tail_results: list[list[Any]] = []
        """Per transaction committed in the current batch: each tail's result."""
        self._send, self._receive = trio.open_memory_channel[_Pending](math.inf)
        self._unanswered = 0
        self._idle = trio.Event()
        self._idle.set()
        self.batches = 0
        """Published: transactions committed so far."""

    def submit(self, operation: Callable[[Tx], T], reply: Callable[[T | StoreError], None]) -> None:
        """Run `operation` in the next batch; `reply` gets its result once committed."""
        self._send.send_nowait(_Pending(operation=operation, reply=reply))
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
        called once it waits for its batch: what `queued` submits joins that batch."""
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
        task_status.started()
        async for first in self._receive:
            batch = [first]
            while len(batch) < MAX_BATCH:
                try:
                    batch.append(self._receive.receive_nowait())
                except trio.WouldBlock:
                    break
            results = await self._commit([pending.operation for pending in batch])
            self.batches += 1
            for pending, result in zip(batch, results, strict=True):
                pending.reply(result)
            self._unanswered -= len(batch)
            if self._unanswered == 0:
                self._idle.set()
            committed, self._tail_results = self._tail_results, []
            for tail_results in committed:
                for tail, result in zip(self._tails, tail_results, strict=True):
                    tail.committed(result)

    async def _commit(self, operations: list[Callable[[Tx], Any]]) -> list[Any]:
        try:
            return await self._run_batch(operations)
        except Exception as error:
            if len(operations) == 1:
                return [self._failed(error)]
        results = []
        for operation in operations:
            try:
                results.extend(await self._run_batch([operation]))
            except Exception as error:
                results.append(self._failed(error))
        return results

    async def _run_batch(self, operations: list[Callable[[Tx], Any]]) -> list[Any]:
        count = len(operations)
        operations = [*operations, *(tail.operation() for tail in self._tails)]
        started_s = time.perf_counter()
        try:
            results = await self._transaction(operations)
        except StoreError as error:
            if self._meter is not None:
                self._meter.batch_failed(error)
            raise
        if self._meter is not None:
            self._meter.batch_committed(count, time.perf_counter() - started_s)
        self._tail_results.append(results[count:])
        del results[count:]
        return results

    async def _transaction(self, operations: list[Callable[[Tx], Any]]) -> list[Any]:
        if not self._use_thread:
            return self.store.run_batch(operations)
        if (now := self.store.run_batch_now(operations)) is not None:
            # SQLite: run here, where the rest of the hub's Python runs anyway (one
            # interpreter lock); a hand-off to a thread and back costs more than the fsync.
            return now
        # Not abandoned on cancellation: a commit that started is let finish.
        return await trio.to_thread.run_sync(self.store.run_batch, operations)

    def _failed(self, error: Exception) -> StoreError:
        if isinstance(error, StoreError):
            return error
        logger.error("hub: an operation failed", exc_info=error)
        return StoreError(url=self.store.name, reason=f"an operation failed: {error!r}")
