"""The actor graph of one worker: its inboxes first, then its actors, started in order.

Every inbox is opened before any actor exists (`Inboxes`), so each actor is
built with everything it talks to and nothing is wired later. `run_actors`
starts the executors, the dispatcher and the slot-table actor (with its watch fan-out)
with `nursery.start`, each reporting ready; task actors run in a nursery of
their own, which closes (every task actor ended) before the executors stop.
`ActorProbe` reads the worker's state the way everyone else must: through the
slot table's inbox and what the other actors publish.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import AsyncIterator, Callable, Sequence

import attrs
import trio

from blockx.actors._dispatcher import DispatcherActor
from blockx.actors._inbox import Inbox
from blockx.actors._messages import (
    CodeLoaded,
    DispatcherMessage,
    ForceDrain,
    GetStatus,
    MarkReady,
    SlotTableMessage,
    StartDrain,
    WorkerStatus,
)
from blockx.actors._readiness import Readiness
from blockx.actors._retained import RetainedSnapshots
from blockx.actors._slot_table import FreeSlots, SlotTableActor
from blockx.actors._task import Admission, TaskRuntime
from blockx.actors._watch import WatchFanout
from blockx.config import WorkerConfig
from blockx.executors import ExecutorPoolConfig, ExecutorTransport, PoolEvent
from blockx.functions import FunctionCodeView, FunctionSnapshot
from blockx.identity import WorkerIdentity
from blockx.io import IOSystem
from blockx.observability.metrics import WorkerSnapshot
from blockx.observability.tracing import TaskTracing
from blockx.phases.builders import builder_registry
from blockx.phases.plugins import plugin_registry
from blockx.process.clock import EpochClock
from blockx.process.lifecycle import rss_bytes
from blockx.profiles import Profile
from blockx.slots import SlotMachine, TaskResult
from blockx.steps import StimulusIds

TransportFactory = Callable[
    [ExecutorPoolConfig, trio.MemorySendChannel[PoolEvent], EpochClock], ExecutorTransport
]
"""Makes the executors (`ExecutorPoolManager`, or a test's fake) from their settings, the
channel their events go to (the dispatcher's inbox) and the worker's clock."""


@attrs.frozen
class Inboxes:
    """Every inbox of the worker's actors, opened before any actor exists."""

    slot_table: Inbox[SlotTableMessage] = attrs.Factory(Inbox)
    dispatcher: Inbox[DispatcherMessage] = attrs.Factory(Inbox)

    def code_loaded(self, snapshot: FunctionSnapshot) -> None:
        """Where the code refresher delivers each new snapshot."""
        self.slot_table.post(CodeLoaded(snapshot=snapshot))

    def executor_events(self) -> trio.MemorySendChannel[PoolEvent]:
        """The channel executors' events go to: the dispatcher's inbox."""
        return self.dispatcher.sender


@attrs.frozen(kw_only=True)
class WorkerActors:
    """The running actors, as the rest of the worker sees them."""

    inboxes: Inboxes
    transport: ExecutorTransport
    fanout: WatchFanout
    probe: ActorProbe
    drained: trio.Event
    """Set once draining started and no task is live any more."""
    readiness: Readiness
    """Whether some executor is up: the worker admits work only then."""
    free_slots: FreeSlots
    """How many slots are free (published by the slot table)."""
    retained: RetainedSnapshots
    """The terminal snapshots of retained results (published by the slot table)."""

    def start_drain(self) -> None:
        """Stop admitting: new slots and unactivated submits are refused from now on."""
        self.inboxes.slot_table.post(StartDrain())

    async def finish_drain(self, timeout_ms: int) -> bool:
        """Wait up to `timeout_ms` for the live tasks to end, then end those left (each
        converges to a terminal result). True when some had to be ended."""
        with trio.move_on_after(timeout_ms / 1000):
            await self.drained.wait()
        if self.drained.is_set():
            return False
        self.inboxes.slot_table.post(ForceDrain())
        await self.drained.wait()
        return True


@attrs.frozen(kw_only=True)
class ActorProbe:
    """Reads the worker's state from its actors; see `blockx.observability.metrics.WorkerProbe`."""

    slot_table: Inbox[SlotTableMessage]
    fanout: WatchFanout
    transport: ExecutorTransport
    identity: WorkerIdentity
    clock: EpochClock

    async def snapshot(self) -> WorkerSnapshot:
        status: WorkerStatus = await self.slot_table.ask(lambda reply: GetStatus(reply=reply))
        return WorkerSnapshot(
            at_ms=self.clock.now_ms(),
            identity=self.identity,
            heartbeat=status.heartbeat,
            slots=status.slots,
            tasks=status.tasks,
            executors=self.transport.snapshot(),
            watch_streams=self.fanout.open_streams,
            worker_rss_bytes=rss_bytes(),
            retained_results=status.retained_results,
            retained_bytes=status.retained_bytes,
        )


@attrs.frozen(kw_only=True)
class ActorParts:
    """Everything the actor graph is built from; the inboxes are already open."""

    config: WorkerConfig
    profile: Profile
    inboxes: Inboxes
    code: FunctionCodeView
    """Holds the first snapshot of function code; the slot-table actor owns it from now on."""
    executors: TransportFactory
    identity: WorkerIdentity
    clock: EpochClock
    tracing: TaskTracing
    on_finished: Sequence[Callable[[TaskResult], None]] = ()
    draws: random.Random | None = None
    """Where the dispatcher's random draws (retry jitter) come from; None: a fresh,
    unseeded `random.Random` (a simulation passes a seeded one)."""


@contextlib.asynccontextmanager
async def run_actors(nursery: trio.Nursery, parts: ActorParts) -> AsyncIterator[WorkerActors]:
    """Start the worker's actors in `nursery`; on exit, end every task actor, then stop
    the executors. The slot table keeps running until `nursery` ends."""
    config, inboxes = parts.config, parts.inboxes
    stimuli = StimulusIds()
    fanout = WatchFanout(slot_table=inboxes.slot_table)
    transport = parts.executors(config.pool_config(), inboxes.executor_events(), parts.clock)
    await nursery.start(transport.run)
    executors_up, readiness = Readiness(), Readiness()
    dispatcher = DispatcherActor(
        inbox=inboxes.dispatcher,
        transport=transport,
        slot_table=inboxes.slot_table,
        settings=config.dispatcher,
        clock=parts.clock,
        stimuli=stimuli,
        rng=parts.draws,
        readiness=executors_up,
    )
    await nursery.start(dispatcher.run)
    runtime = _task_runtime(parts)
    try:
        async with trio.open_nursery() as task_nursery:
            slot_table = SlotTableActor(
                machine=SlotMachine(config.worker.slot_config()),
                code=parts.code,
                inbox=inboxes.slot_table,
                fanout=fanout,
                dispatcher=inboxes.dispatcher,
                runtime=runtime,
                task_nursery=task_nursery,
                clock=parts.clock,
                stimuli=stimuli,
                tracing=parts.tracing,
                on_finished=parts.on_finished,
            )
            await nursery.start(slot_table.run)
            nursery.start_soon(_follow_readiness, executors_up, inboxes.slot_table, readiness)
            probe = ActorProbe(
                slot_table=inboxes.slot_table,
                fanout=fanout,
                transport=transport,
                identity=parts.identity,
                clock=parts.clock,
            )
            yield WorkerActors(
                inboxes=inboxes,
                transport=transport,
                fanout=fanout,
                probe=probe,
                drained=slot_table.drained,
                readiness=readiness,
                free_slots=slot_table.free_slots,
                retained=slot_table.retained,
            )
    finally:
        with trio.CancelScope(shield=True):
            await runtime.io.aclose()  # what no task closed: none, unless the worker failed
            await transport.stop()


async def _follow_readiness(
    executors_up: Readiness, slot_table: Inbox[SlotTableMessage], readiness: Readiness
) -> None:
    """The slot table admits work only while some executor is up: tell it each change,
    then `readiness`, which the rest of the worker follows (so whatever it sends after
    seeing a change reaches the slot table after the change did)."""
    while True:
        ready = not readiness.ready
        await executors_up.wait_until(ready)
        slot_table.post(MarkReady(ready=ready))
        readiness.set(ready)


def _task_runtime(parts: ActorParts) -> TaskRuntime:
    admission = parts.config.admission
    return TaskRuntime(
        builders=builder_registry(parts.profile.builders),
        plugins=plugin_registry(parts.profile.plugins),
        admission=Admission.of(
            builder=admission.builder_slots,
            executor=admission.executor_task_slots,
            plugin=admission.plugin_slots,
            scan=admission.scan_slots,
        ),
        phase_io_timeout_ms=parts.config.phase_io_timeout_ms,
        io=IOSystem(
            parts.config.io.limits(),
            table_database=parts.config.io.table_database,
            bundle_root=parts.config.io.bundle_root,
        ),
        slot_table=parts.inboxes.slot_table,
        dispatcher=parts.inboxes.dispatcher,
        stream_build=parts.config.stream_build.enabled,
        pending_calls=parts.config.stream_build.pending_calls,
    )
