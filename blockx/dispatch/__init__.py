"""The pure call-dispatch core: which call runs on which executor, when, and what a failure means.

Owns ready queues, per-task in-flight windows, fairness between tasks,
retries with back-off and jitter, subcalls and cancellation. Imports only the
standard library, attrs and `blockx.calls`; never reads a clock, draws a
random number or does IO: time and draws arrive on events.
"""

from blockx.dispatch._commands import (
    CallDispatch,
    CancelCalls,
    DeliverSubcallResult,
    DispatchCommand,
    FinishCallPhase,
    ReplaceExecutor,
    RevokeCalls,
    RunCalls,
)
from blockx.dispatch._core import DispatchCore, Step
from blockx.dispatch._events import (
    CallResultsArrived,
    CallsAdded,
    ClockTicked,
    DispatchEvent,
    ExecutorJoined,
    ExecutorLeft,
    SubcallRequested,
    TaskCancelled,
    TaskOpened,
)
from blockx.dispatch._model import CallPolicy

__all__ = [
    "CallDispatch",
    "CallPolicy",
    "CallResultsArrived",
    "CallsAdded",
    "CancelCalls",
    "ClockTicked",
    "DeliverSubcallResult",
    "DispatchCommand",
    "DispatchCore",
    "DispatchEvent",
    "ExecutorJoined",
    "ExecutorLeft",
    "FinishCallPhase",
    "ReplaceExecutor",
    "RevokeCalls",
    "RunCalls",
    "Step",
    "SubcallRequested",
    "TaskCancelled",
    "TaskOpened",
]
