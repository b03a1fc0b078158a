"""Errors of the slot table, split by who is at fault.

`WorkerError` and its subclasses are the caller's fault (a client asked for
something the worker cannot or will not do); each has a stable `code` that the
gRPC front end maps to a status. A report the machine never asked for is the
runtime's fault and raises `blockx.errors.Misuse`. Either way the machine's
state is left exactly as it was before the call.
"""

from __future__ import annotations

import datetime
import enum

from blockx.errors import BlockxError, InvalidValue, shown


class ErrorCode(enum.Enum):
    INVALID_ARGUMENT = "InvalidArgument"
    NO_SLOT = "NoSlot"
    UNAVAILABLE = "Unavailable"
    INVALID_SLOT = "InvalidSlot"
    NOT_FOUND = "NotFound"
    SLOT_UNCERTAIN = "SlotUncertain"


class WorkerError(BlockxError):
    """A request the worker refuses. State is unchanged."""

    code: ErrorCode


class InvalidArgument(WorkerError, InvalidValue):
    """A field of the request is out of range; `field` is its path in the request."""

    code = ErrorCode.INVALID_ARGUMENT


class NoSlot(WorkerError):
    code = ErrorCode.NO_SLOT

    def __init__(self, *, task_id: str, task_slots: int) -> None:
        self.task_id = task_id
        self.task_slots = task_slots
        super().__init__(f"no free slot for task {task_id!r}: all {task_slots} slots are in use")


class Unavailable(WorkerError):
    code = ErrorCode.UNAVAILABLE

    def __init__(self, *, task_id: str, ready: bool = True) -> None:
        self.task_id = task_id
        self.ready = ready
        why = "draining" if ready else "not ready (no executor is healthy)"
        super().__init__(f"worker is {why} and admits no new work (task {task_id!r})")


class InvalidSlot(WorkerError):
    code = ErrorCode.INVALID_SLOT

    def __init__(
        self,
        *,
        task_id: str,
        slot_id: str,
        held_by: str | None,
        known: bool,
        lease_expired_at_ms: int | None = None,
    ) -> None:
        self.task_id = task_id
        self.slot_id = slot_id
        self.held_by = held_by
        self.known = known
        self.lease_expired_at_ms = lease_expired_at_ms
        if not known:
            why = "no such slot on this worker"
        elif lease_expired_at_ms is not None:
            at = datetime.datetime.fromtimestamp(lease_expired_at_ms / 1000, datetime.UTC)
            why = (
                f"its reservation lapsed: the lease expired at "
                f"{at.isoformat(timespec='milliseconds').replace('+00:00', 'Z')} "
                f"({lease_expired_at_ms} ms) before a task was submitted; reserve a slot again"
            )
        elif held_by is None:
            why = "the slot is not reserved"
        else:
            why = f"the slot is held by task {held_by!r}"
        super().__init__(f"slot_id={shown(slot_id)} cannot be used by task {task_id!r}: {why}")


class NotFound(WorkerError):
    """The task is unknown, or (`evicted`) it ended but its result is no longer kept."""

    code = ErrorCode.NOT_FOUND

    def __init__(self, *, task_id: str, evicted: bool = False) -> None:
        self.task_id = task_id
        self.evicted = evicted
        if evicted:
            why = (
                f"the result of task {task_id!r} was evicted before its retention ended, "
                "oldest first, to keep retained results under worker.resultRetentionBytes"
            )
        else:
            why = (
                f"task {task_id!r} is unknown: never submitted here, "
                "or its result retention has ended"
            )
        super().__init__(why)


class SlotUncertain(WorkerError):
    """The task's reservation has passed its lease expiry but is not yet reclaimed.

    Retrying after a moment gets a definite answer.
    """

    code = ErrorCode.SLOT_UNCERTAIN

    def __init__(self, *, task_id: str, slot_id: str, lease_expired_at_ms: int) -> None:
        self.task_id = task_id
        self.slot_id = slot_id
        self.lease_expired_at_ms = lease_expired_at_ms
        super().__init__(
            f"the lease of slot {slot_id!r} for task {task_id!r} expired at "
            f"{lease_expired_at_ms} ms and the slot is being reclaimed; reserve again"
        )


class InvalidConfig(InvalidValue):
    """A slot-table setting is out of range or inconsistent with another."""
