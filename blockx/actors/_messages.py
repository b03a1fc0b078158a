"""Every message the worker's actors exchange, in one place, grouped by the inbox it goes to.

A task's path through the actors, one message per hop:

    client -> SubmitTask -> slot table (activates it: finds its builder and plugin, or
           refuses it there) -> StartBuilderPhase -> task actor (started) -> PhaseDone(BUILDER)
           (an `InlineBuilder` builds in the slot table: no actor, no message)
           -> slot table -> StartCallPhase -> RunTaskCalls (under executor admission)
           (a streamed task: under scan admission, and its task actor sends the calls
           to the dispatcher in AddTaskCalls as its builder reads them)
           -> dispatcher -> CallsDone -> slot table -> StartPluginPhase -> task actor
           -> PhaseDone(PLUGIN)
           (a task without a result handler: its plugin phase succeeds in the slot table)
           -> slot table -> its watch fan-out (every step above) -> WatchStream -> client

Each arrow is a `post` on the receiving actor's `Inbox` (see `_inbox`).
"""

from __future__ import annotations

import attrs

from blockx.actors._call_window import CallWindow
from blockx.actors._inbox import Reply
from blockx.actors._streams import FedTasks, HubStream, TaskStream, WatchStream
from blockx.calls import CallFailurePolicy, CallPhaseOutcome, CallSpec, FailureCode, RetryPolicy
from blockx.executors import PoolEvent
from blockx.functions import FunctionSnapshot
from blockx.slots import (
    Heartbeat,
    PhaseOutcome,
    SlotView,
    TaskPhase,
    TaskSnapshot,
    TaskSpec,
)

# ------------------------------------------------- to the slot-table actor
# from clients (through the front end)


@attrs.frozen(kw_only=True)
class RequestSlot:
    task_id: str
    ttl_ms: int
    reply: Reply[TaskSnapshot]


@attrs.frozen(kw_only=True)
class SubmitTask:
    spec: TaskSpec
    slot_id: str | None
    reply: Reply[TaskSnapshot]
    stream: TaskStream | None = None
    """Set for a submit on a `RunTasks` stream: without `slot_id` it waits for a free slot
    instead of being refused, and once accepted the stream follows the task."""


@attrs.frozen(kw_only=True)
class RunFedTask:
    """Submit a task a hub fed this node: taken at once (`NoSlot` without a free slot, never
    held), and once accepted `stream` follows it to its end."""

    spec: TaskSpec
    stream: FedTasks
    reply: Reply[TaskSnapshot]


@attrs.frozen(kw_only=True)
class CancelTask:
    """End a submitted task now, FAILED with `failure_code` (a hub ended its attempt)."""

    task_id: str
    failure_code: FailureCode
    message: str


@attrs.frozen(kw_only=True)
class GetResult:
    task_id: str
    reply: Reply[TaskSnapshot]


@attrs.frozen(kw_only=True)
class GetStatus:
    reply: Reply[WorkerStatus]


@attrs.frozen(kw_only=True)
class OpenWatch:
    """Start following `stream.task_ids`; NotFound (via the stream) if one is unknown."""

    stream: WatchStream


# from task actors and the dispatcher


@attrs.frozen(kw_only=True)
class PhaseDone:
    """The builder or the plugin phase of `task_id` ended."""

    task_id: str
    phase: TaskPhase
    outcome: PhaseOutcome
    calls: tuple[CallSpec, ...] = ()
    """What a builder phase built."""


@attrs.frozen(kw_only=True)
class CallsDone:
    """The calls phase of `task_id` ended (from the dispatcher)."""

    task_id: str
    outcome: CallPhaseOutcome


# from the watch fan-out, the code refresher and the application


@attrs.frozen(kw_only=True)
class WatchChanged:
    """`task_id` got its first stream (`attached`), or lost its last one."""

    task_id: str
    attached: bool
    broken: bool = False


@attrs.frozen(kw_only=True)
class CodeLoaded:
    """A new snapshot of function code is current."""

    snapshot: FunctionSnapshot


@attrs.frozen(kw_only=True)
class MarkReady:
    """Some executor is healthy (`ready`), or none is any more: admit work only while one is."""

    ready: bool = True


@attrs.frozen(kw_only=True)
class StartDrain:
    pass


@attrs.frozen(kw_only=True)
class ForceDrain:
    """The drain timeout passed: every live task must end now."""


# from the front end and the application, for the slot table's watch fan-out


@attrs.frozen(kw_only=True)
class Subscribe:
    """Deliver `snapshots` (the current state) to `stream`, then every later update."""

    stream: HubStream
    snapshots: tuple[TaskSnapshot, ...]


@attrs.frozen(kw_only=True)
class Unsubscribe:
    """The stream ended: cleanly (`broken` False) or because its client went away."""

    stream: HubStream
    broken: bool


@attrs.frozen(kw_only=True)
class CloseAllStreams:
    """Shutdown: every stream ends after what it already has is delivered."""


SlotTableMessage = (
    RequestSlot
    | SubmitTask
    | RunFedTask
    | CancelTask
    | GetResult
    | GetStatus
    | OpenWatch
    | PhaseDone
    | CallsDone
    | WatchChanged
    | CodeLoaded
    | MarkReady
    | StartDrain
    | ForceDrain
    | Subscribe
    | Unsubscribe
    | CloseAllStreams
)


# ------------------------------------------------------ to the dispatcher


@attrs.frozen(kw_only=True)
class RunTaskCalls:
    """Run every call of `task_id` against `code`; the end comes back as `CallsDone`."""

    task_id: str
    code: FunctionSnapshot
    calls: tuple[CallSpec, ...]
    retry: RetryPolicy
    failure_policy: CallFailurePolicy
    window: CallWindow | None = None
    """Set for a streamed task: `calls` is empty, the calls come from its task actor in
    `AddTaskCalls` (the last one sealed) and the dispatcher counts their ends in `window`."""


@attrs.frozen(kw_only=True)
class AddTaskCalls:
    """More calls of a streamed task (from its task actor); `sealed`: the stream has ended."""

    task_id: str
    calls: tuple[CallSpec, ...]
    sealed: bool


@attrs.frozen(kw_only=True)
class StreamFailed:
    """A streamed task's builder failed while reading: its call phase ends with `outcome`."""

    task_id: str
    outcome: CallPhaseOutcome


@attrs.frozen(kw_only=True)
class CancelTaskCalls:
    """The task has ended: cancel whatever of its calls still runs (nothing is reported)."""

    task_id: str


DispatcherMessage = RunTaskCalls | AddTaskCalls | StreamFailed | CancelTaskCalls | PoolEvent


# ----------------------------------------------------------- values


@attrs.frozen(kw_only=True)
class WorkerStatus:
    """The slot table's answer to `GetStatus`: capacity, every slot and every task holding one."""

    heartbeat: Heartbeat
    slots: tuple[SlotView, ...]
    tasks: tuple[TaskSnapshot, ...]
    waiting_submits: int = 0
    """Submits from `RunTasks` streams held until a slot is free."""
    retained_results: int = 0
    """Terminal results kept for reads."""
    retained_bytes: int = 0
    """Their size, as `worker.resultRetentionBytes` bounds it."""
