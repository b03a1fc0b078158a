"""`PlacementClient`: places tasks across the workers registered in etcd.

Must never retry a call on its own, but for placement's one rule: trying the
next worker after a refusal that proves the task did not start there.

A batch (`run_tasks`) is spread by `BatchSpread`: each task goes to the
worker that has the most free slots left once the batch's earlier tasks are
counted, and runs on one `RunTasks` stream per worker, opened when the first
task goes there. A refusal RESOURCE_EXHAUSTED or UNAVAILABLE (a draining
worker) sends the task to the best worker it has not tried; anything else,
and a stream that breaks (the task may have started), ends the task with that
error. The streams half-close once every task of the batch has ended.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import logging
import math
from collections.abc import AsyncIterator, Callable, Iterable, Sequence

import attrs
import trio
from grpclib.const import Status

from blockx._proto.blockx.worker import v1 as pb
from blockx.client._errors import InvalidWorkerAddress, WorkerCallError, WorkerUnreachable
from blockx.client._outcomes import TaskOutcome
from blockx.client._specs import InvalidTaskSpec
from blockx.client._worker import WorkerClient, outcomes_of
from blockx.config import default_config
from blockx.discovery import EtcdClient, EtcdError, Rejected, WorkerDirectory, WorkerHeartbeat
from blockx.errors import BlockxError
from blockx.net.channels import asyncio_loop
from blockx.net.tls import ClientTls

logger = logging.getLogger("blockx.client")

DEFAULT_REGISTRY_PREFIX = default_config().etcd.registry_prefix
"""Where workers of the block profile register (`workerRegistryPrefix`)."""
WATCH_RETRY_MIN_S = 0.5
WATCH_RETRY_MAX_S = 5.0
"""Back-off between attempts to resume the registry watch while etcd is unreachable."""
_TRY_NEXT_WORKER = frozenset({Status.RESOURCE_EXHAUSTED, Status.UNAVAILABLE})


class NoWorkerAvailable(BlockxError):
    """No worker registered under `prefix` could take task `task_id`.

    `attempts` holds (worker address, what went wrong) for each worker tried,
    in the order tried; `workers_seen` and `draining` count the view's workers.
    """

    def __init__(
        self,
        *,
        task_id: str,
        prefix: str,
        workers_seen: int,
        draining: int,
        attempts: tuple[tuple[str, str], ...],
    ) -> None:
        self.task_id = task_id
        self.prefix = prefix
        self.workers_seen = workers_seen
        self.draining = draining
        self.attempts = attempts
        if attempts:
            tried = "; ".join(f"{address}: {reason}" for address, reason in attempts)
            situation = f"every worker tried refused it ({tried})"
        elif workers_seen == 0:
            situation = "no worker is registered there"
        elif draining == workers_seen:
            situation = f"all {workers_seen} registered workers are draining"
        else:
            situation = f"none of the {workers_seen} registered workers has a free slot"
        super().__init__(f"cannot place task {task_id} under {prefix!r}: {situation}")


@attrs.frozen(kw_only=True)
class Placement:
    """Where a task went: the worker, the slot reserved there, and the submit's answer."""

    worker_addr: str
    slot_id: str
    response: pb.SubmitTaskResponse
    client: WorkerClient = attrs.field(eq=False, repr=False)
    """The client of that worker, to follow the task (valid while the placement client is)."""


class PlacementClient:
    """Places tasks on the workers registered under an etcd prefix.

    Make it with `async with PlacementClient.connect(endpoints, prefix)`: it
    reads the registry (Range), then follows it (Watch from the next
    revision) into a `WorkerDirectory`, resuming with a fresh Range after an
    etcd outage. `place` reserves a slot on the worker with the most free
    slots (never a draining one) and submits the task into it; a worker that
    answers RESOURCE_EXHAUSTED or UNAVAILABLE, or cannot be reached while
    reserving, is passed over for the next-best one. A submit whose connection
    breaks is not retried elsewhere: the task may have started there.
    `PlacementClient.over(directory)` is the same without etcd (a fixed view).
    Every worker is called with the same bearer token and TLS settings, if any.
    """

    def __init__(
        self,
        *,
        directory: WorkerDirectory,
        workers: contextlib.AsyncExitStack,
        slot_ttl_ms: int,
        token: str | None = None,
        tls: ClientTls | None = None,
    ) -> None:
        self.directory = directory
        self._workers = workers
        self._slot_ttl_ms = slot_ttl_ms
        self._token = token
        self._tls = tls
        self._clients: dict[str, WorkerClient] = {}
        self._changed = trio.Event()

    @classmethod
    @contextlib.asynccontextmanager
    async def over(
        cls,
        directory: WorkerDirectory,
        *,
        slot_ttl_ms: int = 0,
        token: str | None = None,
        tls: ClientTls | None = None,
    ) -> AsyncIterator[PlacementClient]:
        """A placement client of the workers in `directory`, which the caller keeps current.

        Worker channels are opened on first use and closed on exit. `slot_ttl_ms`
        is the reservation lease (0 = each worker's default). `token` and `tls` are
        `WorkerClient.connect`'s, for every worker; the TLS files are read now, so a
        bad one fails here rather than at the first worker.
        """
        asyncio_loop("PlacementClient")
        if tls is not None:
            tls.context()
        async with contextlib.AsyncExitStack() as workers:
            yield cls(
                directory=directory,
                workers=workers,
                slot_ttl_ms=slot_ttl_ms,
                token=token,
                tls=tls,
            )

    @classmethod
    @contextlib.asynccontextmanager
    async def connect(
        cls,
        etcd_endpoints: str | Sequence[str],
        prefix: str = DEFAULT_REGISTRY_PREFIX,
        *,
        slot_ttl_ms: int = 0,
        token: str | None = None,
        tls: ClientTls | None = None,
    ) -> AsyncIterator[PlacementClient]:
        """A placement client of the fleet under `prefix` in the etcd at `etcd_endpoints`.

        `etcd_endpoints` is "host:port[,host:port...]" or a sequence of them.
        Entering reads the registry once; an unreachable etcd raises
        EtcdUnavailable here. Must run inside `trio_asyncio.open_loop()`. `token`
        and `tls` are for the workers (see `over`), not for etcd.
        """
        if isinstance(etcd_endpoints, str):
            etcd_endpoints = [part.strip() for part in etcd_endpoints.split(",") if part.strip()]
        directory = WorkerDirectory(prefix=prefix)
        async with (
            cls.over(directory, slot_ttl_ms=slot_ttl_ms, token=token, tls=tls) as placement,
            EtcdClient.connect(etcd_endpoints) as etcd,
            trio.open_nursery() as nursery,
        ):
            await nursery.start(placement._follow, etcd)
            try:
                yield placement
            finally:
                nursery.cancel_scope.cancel()

    def workers(self) -> tuple[WorkerHeartbeat, ...]:
        """The registered workers as last seen, by address."""
        return self.directory.workers()

    async def wait_for(
        self, predicate: Callable[[tuple[WorkerHeartbeat, ...]], bool]
    ) -> tuple[WorkerHeartbeat, ...]:
        """Until `predicate(workers())` holds; returns those workers."""
        while not predicate(workers := self.directory.workers()):
            await self._changed.wait()
        return workers

    async def place(self, task: pb.TaskSpec) -> Placement:
        """Reserve a slot for `task` on the best worker and submit it there.

        Raises NoWorkerAvailable (naming each worker tried and its answer) when
        no worker can take it; any other refusal is the worker's WorkerCallError.
        """
        attempts: list[tuple[str, str]] = []
        for worker in self.directory.placement_order():
            try:
                client = await self._client(worker.address)
                reservation = await client.request_slot(task.task_id, self._slot_ttl_ms)
            except (InvalidWorkerAddress, WorkerUnreachable) as error:
                attempts.append((worker.address, str(error)))
                continue
            except WorkerCallError as error:
                if error.status not in _TRY_NEXT_WORKER:
                    raise
                attempts.append((worker.address, _refusal(error)))
                continue
            self.directory.note_placed(worker.address)
            try:
                response = await client.submit(task, reservation.slot_id)
            except WorkerCallError as error:
                if error.status not in _TRY_NEXT_WORKER:
                    raise
                attempts.append((worker.address, _refusal(error)))
                continue
            return Placement(
                worker_addr=worker.address,
                slot_id=reservation.slot_id,
                response=response,
                client=client,
            )
        workers = self.directory.workers()
        raise NoWorkerAvailable(
            task_id=task.task_id,
            prefix=self.directory.prefix,
            workers_seen=len(workers),
            draining=sum(1 for worker in workers if worker.draining),
            attempts=tuple(attempts),
        )

    async def run_task(
        self, task: pb.TaskSpec, *, on_update: Callable[[pb.TaskUpdate], None] | None = None
    ) -> tuple[Placement, pb.TaskResult]:
        """Place `task`, follow it on its worker, and return where it ran and its result."""
        placement = await self.place(task)
        # The submit repeats (idempotent by task id: it answers the task's snapshot)
        # so that WorkerClient.run_task follows it exactly as for a direct submit.
        result = await placement.client.run_task(
            task, slot_id=placement.slot_id, on_update=on_update
        )
        return placement, result

    @contextlib.asynccontextmanager
    async def run_tasks(
        self, tasks: Iterable[pb.TaskSpec]
    ) -> AsyncIterator[trio.MemoryReceiveChannel[TaskOutcome]]:
        """Spread `tasks` over the fleet: `async with placement.run_tasks(tasks) as outcomes`.

        `outcomes` yields a `TaskOutcome` per task as it ends, from whichever
        worker ran it (see the module's docstring for the placement rule). A
        task no worker would take ends with NoWorkerAvailable, naming each
        worker tried; a worker's broken stream ends each of its unfinished
        tasks with that stream's error, and the other workers' streams go on.
        Each task id may appear once in `tasks` (InvalidTaskSpec otherwise).
        Leaving the block early resets every stream.
        """
        batch = list(tasks)
        seen: set[str] = set()
        for task in batch:
            if task.task_id in seen:
                allowed = "appears twice in the batch; give each task id once"
                raise InvalidTaskSpec(field="task_id", value=task.task_id, allowed=allowed)
            seen.add(task.task_id)
        async with outcomes_of(functools.partial(self._spread, batch)) as outcomes:
            yield outcomes

    async def _spread(
        self, batch: list[pb.TaskSpec], ended: trio.MemorySendChannel[TaskOutcome]
    ) -> None:
        events, received = trio.open_memory_channel[TaskOutcome | StreamLost](math.inf)
        with ended:
            async with trio.open_nursery() as nursery:

                def open_stream(address: str) -> trio.MemorySendChannel[pb.TaskSpec]:
                    to_send, to_read = trio.open_memory_channel[pb.TaskSpec](math.inf)
                    nursery.start_soon(self._run_stream, address, to_read, events)
                    return to_send

                spread = BatchSpread(directory=self.directory, open_stream=open_stream)
                for outcome in spread.start(batch):
                    await ended.send(outcome)
                while not spread.done:
                    for outcome in spread.handle(await received.receive()):
                        await ended.send(outcome)

    async def _run_stream(
        self,
        address: str,
        tasks: trio.MemoryReceiveChannel[pb.TaskSpec],
        events: trio.MemorySendChannel[TaskOutcome | StreamLost],
    ) -> None:
        """One worker's `RunTasks` stream: each outcome, or how the stream broke, to `events`."""
        with tasks:
            try:
                client = await self._client(address)
                async with client.run_tasks(tasks) as outcomes:
                    async for outcome in outcomes:
                        events.send_nowait(outcome)
            except BlockxError as error:
                events.send_nowait(StreamLost(worker_addr=address, error=error))

    async def _client(self, address: str) -> WorkerClient:
        client = self._clients.get(address)
        if client is None:
            connecting = WorkerClient.connect(address, token=self._token, tls=self._tls)
            client = await self._workers.enter_async_context(connecting)
            self._clients[address] = client
        return client

    async def _follow(
        self, etcd: EtcdClient, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Keep the directory current: Range, then Watch; resync after a broken watch."""
        prefix = self.directory.prefix
        retry_s = WATCH_RETRY_MIN_S
        synced = in_outage = False
        while True:
            try:
                snapshot = await etcd.get_prefix(prefix)
                self._changed_by(
                    self.directory.reset(revision=snapshot.revision, entries=snapshot.entries)
                )
                if not synced:
                    task_status.started()
                    synced = True
                elif in_outage:
                    logger.info("following the worker registry %s again", prefix)
                retry_s, in_outage = WATCH_RETRY_MIN_S, False
                batches = etcd.watch_prefix(prefix, start_revision=snapshot.revision + 1)
                async with contextlib.aclosing(batches):
                    async for events in batches:
                        self._changed_by(self.directory.apply(events))
            except EtcdError as error:
                if not synced:
                    raise
                if not in_outage:
                    logger.warning(
                        "lost the watch of the worker registry %s (%s); placing on the last "
                        "view seen until it resumes",
                        prefix,
                        error,
                    )
                    in_outage = True
                await trio.sleep(retry_s)
                retry_s = min(retry_s * 2, WATCH_RETRY_MAX_S)

    def _changed_by(self, rejected: Sequence[Rejected]) -> None:
        for problem in rejected:
            logger.warning("ignoring registry key %s: %s", problem.key, problem.error)
        self._changed.set()
        self._changed = trio.Event()


def _refusal(error: WorkerCallError) -> str:
    return f"{error.rpc} {error.status.name}" + (f": {error.message}" if error.message else "")


@attrs.frozen(kw_only=True)
class StreamLost:
    """The `RunTasks` stream to `worker_addr` broke with `error`."""

    worker_addr: str
    error: BlockxError = attrs.field(eq=False)


@attrs.define
class BatchSpread:
    """Which worker each task of a batch is on, and which tasks have not ended.

    `open_stream(address)` opens a worker's stream and returns where to send
    its tasks; it is called once per worker, when the first task goes there.
    """

    directory: WorkerDirectory
    open_stream: Callable[[str], trio.MemorySendChannel[pb.TaskSpec]]
    tasks: dict[str, pb.TaskSpec] = attrs.field(factory=dict)
    """The tasks that have not ended, by id."""
    attempts: dict[str, list[tuple[str, str]]] = attrs.field(
        factory=lambda: collections.defaultdict(list)
    )
    """(worker, refusal) of each worker that refused a task, in order."""
    on_worker: dict[str, set[str]] = attrs.field(factory=lambda: collections.defaultdict(set))
    sent: collections.Counter[str] = attrs.field(factory=collections.Counter)
    streams: dict[str, trio.MemorySendChannel[pb.TaskSpec]] = attrs.field(factory=dict)
    lost: set[str] = attrs.field(factory=set)

    @property
    def done(self) -> bool:
        return not self.tasks

    def start(self, batch: Sequence[pb.TaskSpec]) -> list[TaskOutcome]:
        """Send each task of `batch` to its worker; the outcomes of those none can take."""
        self.tasks.update((task.task_id, task) for task in batch)
        ended = [outcome for task in batch if (outcome := self._place(task)) is not None]
        for outcome in ended:
            del self.tasks[outcome.task_id]
        self._close_when_done()
        return ended

    def handle(self, event: TaskOutcome | StreamLost) -> list[TaskOutcome]:
        """The outcomes that end tasks after `event` (a refusal may send a task elsewhere)."""
        if isinstance(event, StreamLost):
            self.lost.add(event.worker_addr)
            stream = self.streams.get(event.worker_addr)
            if stream is not None:
                stream.close()
            left = sorted(self.on_worker.pop(event.worker_addr, set()))
            ended = [
                TaskOutcome(task_id=task_id, worker_addr=event.worker_addr, error=event.error)
                for task_id in left
            ]
        else:
            self.on_worker[event.worker_addr].discard(event.task_id)
            ended = [event]
            refusal = event.refusal
            task = self.tasks.get(event.task_id)
            if refusal is not None and refusal.status in _TRY_NEXT_WORKER and task is not None:
                self.attempts[task.task_id].append((event.worker_addr, _refusal(refusal)))
                placed_elsewhere = self._place(task)
                ended = [] if placed_elsewhere is None else [placed_elsewhere]
        ended = [outcome for outcome in ended if self.tasks.pop(outcome.task_id, None)]
        self._close_when_done()
        return ended

    def _place(self, task: pb.TaskSpec) -> TaskOutcome | None:
        """Send `task` to the best worker it has not tried; its outcome if there is none."""
        tried = {address for address, _ in self.attempts.get(task.task_id, ())}
        workers = self.directory.workers()
        rank = {worker.address: i for i, worker in enumerate(self.directory.placement_order())}
        candidates = [
            worker.address
            for worker in workers
            if not worker.draining and worker.address not in tried | self.lost
        ]
        if not candidates:
            error = NoWorkerAvailable(
                task_id=task.task_id,
                prefix=self.directory.prefix,
                workers_seen=len(workers),
                draining=sum(1 for worker in workers if worker.draining),
                attempts=tuple(self.attempts.get(task.task_id, ())),
            )
            return TaskOutcome(task_id=task.task_id, worker_addr="", error=error)
        address = min(
            candidates,
            key=lambda a: (-self.directory.free_slots(a), self.sent[a], rank.get(a, len(rank)), a),
        )
        self.directory.note_placed(address)
        self.sent[address] += 1
        self.on_worker[address].add(task.task_id)
        stream = self.streams.get(address)
        if stream is None:
            stream = self.streams[address] = self.open_stream(address)
        # A stream that just broke has closed its end; its StreamLost, already on
        # the way, ends this task with the others that were on it.
        with contextlib.suppress(trio.BrokenResourceError):
            stream.send_nowait(task)
        return None

    def _close_when_done(self) -> None:
        """Once every task has ended, half-close each stream: nothing more will go there."""
        if self.done:
            for stream in self.streams.values():
                stream.close()
