"""What the pool manager tells the dispatcher: executor states, events and views.

Owns the vocabulary shared by the pool manager and whatever sits on top of it.
Plain attrs values: must never import trio or touch a process, so the pure
dispatch core can match on these events too.
"""

from __future__ import annotations

import enum
from typing import TypeAlias

import attrs

from blockx.executors._wire import FromExecutor


class ExecutorState(enum.Enum):
    STARTING = "STARTING"
    """Spawned; has not said an accepted Hello yet."""
    READY = "READY"
    """Connected and idle (its last heartbeat reported no running call)."""
    BUSY = "BUSY"
    """Connected and running a call (per its last heartbeat)."""
    LOST = "LOST"
    """Heartbeats stopped, or it never connected, or it broke the protocol."""
    WEDGED = "WEDGED"
    """Alive but its loop stalled past the stall timeout with a call running."""
    EXITED = "EXITED"
    """The process ended or closed its connection on its own."""
    RESTARTING = "RESTARTING"
    """Waiting out the restart delay or back-off before the next process."""
    STOPPED = "STOPPED"
    """The pool stopped it, or restarting is turned off."""


class DownReason(enum.Enum):
    LOST = "LOST"
    WEDGED = "WEDGED"
    EXITED = "EXITED"


@attrs.frozen(kw_only=True)
class ExecutorUp:
    """`executor_id` (process `pid`) is connected and takes calls."""

    executor_id: str
    pid: int


@attrs.frozen(kw_only=True)
class ExecutorDown:
    """The process behind `executor_id` is gone (dead and reaped) for `reason`.

    Every call sent to it and not answered will never be answered.
    `running_call_id` is the call its last heartbeat reported running.
    """

    executor_id: str
    pid: int
    reason: DownReason
    running_call_id: str | None


@attrs.frozen(kw_only=True)
class ExecutorMessage:
    """A message from `executor_id`: CallResults, Subcall, CodeRequest or Heartbeat."""

    executor_id: str
    message: FromExecutor


PoolEvent: TypeAlias = ExecutorUp | ExecutorDown | ExecutorMessage


@attrs.frozen(kw_only=True)
class ExecutorView:
    """One executor as `ExecutorPoolManager.snapshot()` reports it."""

    executor_id: str
    state: ExecutorState
    pid: int | None
    rss_bytes: int
    calls_served: int
    restarts: int
    running_call_id: str | None
