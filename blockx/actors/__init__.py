"""The Trio actors that run the pure cores, and the assembly of the actor graph.

* `SlotTableActor`: the one owner of the slot machine and the function code view.
* task actors (`run_task`): one per task whose builder or plugin waits on IO.
* `DispatcherActor`: the one owner of the dispatch core, driving the executors.
* `WatchFanout`: fans task updates out to watch streams (part of the slot-table actor).
* `RetainedSnapshots`: the terminal snapshots of retained results, published by the slot
  table for the gRPC handlers.

An actor is one task with one inbox (`Inbox`); its messages are all in
`blockx.actors._messages`, re-exported here. `run_actors` starts the graph;
`CallEngine` runs the executors and the dispatcher alone, as a library.
"""

from blockx.actors._assembly import (
    ActorParts,
    ActorProbe,
    Inboxes,
    TransportFactory,
    WorkerActors,
    run_actors,
)
from blockx.actors._call_ids import CallIds
from blockx.actors._call_window import CallWindow
from blockx.actors._dispatcher import DispatcherActor
from blockx.actors._engine import CallEngine
from blockx.actors._inbox import Inbox, Reply
from blockx.actors._messages import (
    AddTaskCalls,
    CallsDone,
    CancelTask,
    CancelTaskCalls,
    CloseAllStreams,
    CodeLoaded,
    DispatcherMessage,
    ForceDrain,
    GetResult,
    GetStatus,
    OpenWatch,
    PhaseDone,
    RequestSlot,
    RunFedTask,
    RunTaskCalls,
    SlotTableMessage,
    StartDrain,
    StreamFailed,
    SubmitTask,
    Subscribe,
    Unsubscribe,
    WatchChanged,
    WorkerStatus,
)
from blockx.actors._retained import RetainedSnapshots
from blockx.actors._slot_table import FreeSlots, SlotTableActor
from blockx.actors._streams import (
    Accepted,
    FedTasks,
    Finished,
    Refused,
    StreamEvent,
    TaskStream,
    WatchStream,
)
from blockx.actors._task import Admission, TaskRuntime, TaskStart, run_task
from blockx.actors._watch import WatchFanout

__all__ = [
    "Accepted",
    "ActorParts",
    "ActorProbe",
    "AddTaskCalls",
    "Admission",
    "CallEngine",
    "CallIds",
    "CallWindow",
    "CallsDone",
    "CancelTask",
    "CancelTaskCalls",
    "CloseAllStreams",
    "CodeLoaded",
    "DispatcherActor",
    "DispatcherMessage",
    "FedTasks",
    "Finished",
    "ForceDrain",
    "FreeSlots",
    "GetResult",
    "GetStatus",
    "Inbox",
    "Inboxes",
    "OpenWatch",
    "PhaseDone",
    "Refused",
    "Reply",
    "RequestSlot",
    "RetainedSnapshots",
    "RunFedTask",
    "RunTaskCalls",
    "SlotTableActor",
    "SlotTableMessage",
    "StartDrain",
    "StreamEvent",
    "StreamFailed",
    "SubmitTask",
    "Subscribe",
    "TaskRuntime",
    "TaskStart",
    "TaskStream",
    "TransportFactory",
    "Unsubscribe",
    "WatchChanged",
    "WatchFanout",
    "WatchStream",
    "WorkerActors",
    "WorkerStatus",
    "run_actors",
    "run_task",
]
