"""Every message the worker's actors exchange, in one place.

An actor is one Trio task that owns some state and takes messages from one
inbox; nothing else touches its state. A request that needs an answer carries
its own `reply`: a plain function the actor calls exactly once, with the
answer or with the `WorkerError` that refuses the request. The actor never
waits for whoever asked, so an asyncio handler (the gRPC front end) can post a
request and wait on a future that `reply` resolves.

Inboxes of the slot-table actor and of the watch hub have no size limit for
messages from other actors (their number is bounded by the tasks and streams
that exist); requests from clients are admitted at the edge, where a full
inbox is answered with UNAVAILABLE instead of queued.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, TypeAlias, TypeVar

import attrs

from blockx.slots import (
    Heartbeat,
    PhaseOutcome,
    SlotView,
    TaskPhase,
    TaskSnapshot,
    TaskSpec,
    WorkerError,
)

if TYPE_CHECKING:
    from blockx.actors._watch import WatchStream

T = TypeVar("T")
Reply: TypeAlias = Callable[[T | WorkerError], None]


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


# from task actors


@attrs.frozen(kw_only=True)
class ActivationDone:
    task_id: str
    slot_id: str
    task_code_epoch: str


@attrs.frozen(kw_only=True)
class ActivationRefused:
    task_id: str
    failure_code: str
    message: str
    retryable: bool


@attrs.frozen(kw_only=True)
class PhaseDone:
    task_id: str
    phase: TaskPhase
    outcome: PhaseOutcome


# from the watch hub


@attrs.frozen(kw_only=True)
class WatchChanged:
    """`task_id` got its first stream (`attached`), or lost its last one."""

    task_id: str
    attached: bool
    broken: bool = False


# from the timer actor and the application


@attrs.frozen(kw_only=True)
class TimersDue:
    pass


@attrs.frozen(kw_only=True)
class StartDrain:
    pass


@attrs.frozen(kw_only=True)
class ForceDrain:
    """The drain timeout passed: every live task must end now."""


SlotTableMessage = (
    RequestSlot
    | SubmitTask
    | GetResult
    | GetStatus
    | OpenWatch
    | ActivationDone
    | ActivationRefused
    | PhaseDone
    | WatchChanged
    | TimersDue
    | StartDrain
    | ForceDrain
)


# ------------------------------------------------------ to the watch hub


@attrs.frozen(kw_only=True)
class Subscribe:
    """Deliver `snapshots` (the current state) to `stream`, then every later update."""

    stream: WatchStream
    snapshots: tuple[TaskSnapshot, ...]


@attrs.frozen(kw_only=True)
class Publish:
    snapshot: TaskSnapshot


@attrs.frozen(kw_only=True)
class Unsubscribe:
    """The stream ended: cleanly (`broken` False) or because its client went away."""

    stream: WatchStream
    broken: bool


@attrs.frozen(kw_only=True)
class Forget:
    """The slot table no longer knows `task_id`: streams still on it are told NotFound."""

    task_id: str


@attrs.frozen(kw_only=True)
class CloseAllStreams:
    """Shutdown: every stream ends after what it already has is delivered."""


WatchHubMessage = Subscribe | Publish | Unsubscribe | Forget | CloseAllStreams


# ----------------------------------------------------------- values


@attrs.frozen(kw_only=True)
class WorkerStatus:
    heartbeat: Heartbeat
    slots: tuple[SlotView, ...]
