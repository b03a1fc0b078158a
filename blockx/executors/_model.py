"""What the pool manager tells the dispatcher: executor states, events and views.

Owns the vocabulary shared by the pool manager and whatever sits on top of it,
and the `ExecutorTransport` protocol the dispatcher actor drives executors
through. Plain attrs values and a protocol: must never import trio at run time
or touch a process.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Protocol, TypeAlias

import attrs

from blockx.executors._wire import FromExecutor, ToExecutor

if TYPE_CHECKING:
    import trio


class ExecutorState(enum.Enum):
    STARTING = "STARTING"
    """Spawned; has not said an accepted Hello yet."""
    READY = "READY"
    """Connected and idle (its last heartbeat reported no running call, or the call it
    reported has been answered since)."""
    BUSY = "BUSY"
    """Connected and running a call (per its last heartbeat, until that call's answer)."""
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
    """One executor as `ExecutorPoolManager.snapshot()` reports it.

    `running_call_id` is the call its last heartbeat reported running, until that call's
    results arrive (they clear it before anyone else sees them). While a call waits on a
    subcall that runs on the same executor, the subcall is the one reported; once it is
    answered, nothing shows running until the next heartbeat names the caller again.
    """

    executor_id: str
    state: ExecutorState
    pid: int | None
    rss_bytes: int
    calls_served: int
    restarts: int
    running_call_id: str | None


class ExecutorTransport(Protocol):
    """The executors as the dispatcher actor and the worker see them.

    `ExecutorPoolManager` runs real processes; a test may pass a fake. Either
    reports `ExecutorUp`, `ExecutorDown` and `ExecutorMessage` events on the
    channel it was made with, and sets `first_healthy` once an executor is up.
    """

    @property
    def first_healthy(self) -> trio.Event: ...

    async def run(self, *, task_status: trio.TaskStatus[None] = ...) -> None:
        """Serve until stopped or cancelled; started() once executors are starting."""
        ...

    async def stop(self) -> None:
        """Let executors finish politely, then end them; returns once all are gone."""
        ...

    def send(self, executor_id: str, message: ToExecutor) -> None:
        """Queue `message` for `executor_id` without waiting; `ExecutorError` if it cannot."""
        ...

    def send_frame(self, executor_id: str, frame: bytes, *, at_once: bool = False) -> None:
        """Queue an encoded frame (`encode_run_calls_frame`); as `send`. `at_once`: the
        caller sends nothing more for now, so the frame may go out without waiting to be
        sent together with others."""
        ...

    def replace(self, executor_id: str, why: str) -> None:
        """End `executor_id`'s process now and start another (it is reported down as
        wedged, `why` in the log); nothing if it is not up."""
        ...

    def snapshot(self) -> tuple[ExecutorView, ...]:
        """Every executor as it is now."""
        ...
