"""The Trio actors that run the pure cores: one task and one inbox each.

* `SlotTableActor`: the one owner of the slot machine.
* task actors (`run_task`): one per admitted task, Builder -> Calls -> Plugin.
* `WatchHub`: fans task updates out to watch streams.
* `TimerActor`: feeds due timers back to the slot table.
* `ExecutorPool`: the dispatcher actor and the executor processes.

Their messages are all in `blockx.actors._messages`.
"""

from blockx.actors._dispatcher import CallsRefused, ExecutorPool, split_wire_call_id, wire_call_id
from blockx.actors._messages import (
    ForceDrain,
    GetResult,
    GetStatus,
    OpenWatch,
    RequestSlot,
    StartDrain,
    SubmitTask,
    Unsubscribe,
    WorkerStatus,
)
from blockx.actors._slot_table import SlotTableActor
from blockx.actors._task import Admission, TaskRuntime, run_task
from blockx.actors._timer import TimerActor, WorkerClock
from blockx.actors._watch import WatchHub, WatchStream

__all__ = [
    "Admission",
    "CallsRefused",
    "ExecutorPool",
    "ForceDrain",
    "GetResult",
    "GetStatus",
    "OpenWatch",
    "RequestSlot",
    "SlotTableActor",
    "StartDrain",
    "SubmitTask",
    "TaskRuntime",
    "TimerActor",
    "Unsubscribe",
    "WatchHub",
    "WatchStream",
    "WorkerClock",
    "WorkerStatus",
    "run_task",
    "split_wire_call_id",
    "wire_call_id",
]
