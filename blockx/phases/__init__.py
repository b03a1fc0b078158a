"""The phases of a task: the call-dispatch core (pure), and later builders and writers.

The dispatch core imports only the standard library and attrs; it never reads
a clock, draws a random number or does IO.
"""

from blockx.phases._dispatch import DispatchCore
from blockx.phases._dispatch_types import (
    CallDispatch,
    CallErrorCode,
    CallFailure,
    CallOutcome,
    CallPhaseOutcome,
    CallPhaseStats,
    CallPolicy,
    CallResultsArrived,
    CallsAdded,
    CallSpec,
    CancelCalls,
    ClockTicked,
    DeliverSubcallResult,
    DispatchCommand,
    DispatchEvent,
    DispatchMisuse,
    ExecutorJoined,
    ExecutorLeft,
    FinishCallPhase,
    RunCalls,
    SubcallRequested,
    TaskCancelled,
    TaskOpened,
)

__all__ = [
    "CallDispatch",
    "CallErrorCode",
    "CallFailure",
    "CallOutcome",
    "CallPhaseOutcome",
    "CallPhaseStats",
    "CallPolicy",
    "CallResultsArrived",
    "CallSpec",
    "CallsAdded",
    "CancelCalls",
    "ClockTicked",
    "DeliverSubcallResult",
    "DispatchCommand",
    "DispatchCore",
    "DispatchEvent",
    "DispatchMisuse",
    "ExecutorJoined",
    "ExecutorLeft",
    "FinishCallPhase",
    "RunCalls",
    "SubcallRequested",
    "TaskCancelled",
    "TaskOpened",
]
