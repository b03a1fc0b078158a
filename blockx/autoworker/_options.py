"""What an automatic worker is built from: its queue, capacity, handlers and timings.

Everything is checked when `WorkerOptions` is made, so a worker that starts has
a valid configuration; a bad value raises `InvalidOption` naming the option.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, Final

import attrs

from blockx.errors import InvalidValue
from blockx.hubwire import MAX_ID_CHARS, Capability

DEFAULT_CAPACITY: Final = 4
MAX_CAPACITY: Final = 256
MAX_HANDLERS: Final = 32
DEFAULT_SHUTDOWN_TIMEOUT_MS: Final = 30_000
MAX_SHUTDOWN_TIMEOUT_MS: Final = 5 * 60_000
DEFAULT_RECONNECT_MIN_MS: Final = 200
MIN_RECONNECT_MIN_MS: Final = 10
DEFAULT_RECONNECT_MAX_MS: Final = 5_000
MAX_RECONNECT_MAX_MS: Final = 30_000
_ID_FORM: Final = re.compile(r"\S(.*\S)?", re.DOTALL)


class InvalidOption(InvalidValue):
    """A `WorkerOptions` value that is not allowed."""

    def describe(self) -> str:
        return f"WorkerOptions.{super().describe()}"


@attrs.frozen(kw_only=True)
class WorkerExecution:
    """What a handler gets for one attempt: never the worker's credential or secrets.

    `task_id` is the key to make effects idempotent across attempts; `attempt_id`
    names this attempt only; `epoch` grows with every attempt of the task, so a
    resource that checks it can refuse writes of an older attempt.
    """

    task_id: str
    attempt_id: str
    epoch: int
    capability: Capability
    payload: Any
    """The task's payload, decoded from JSON."""
    attempt_deadline_ms: int
    """When this attempt must end at the latest (epoch ms): the attempt timeout or the
    task's deadline, whichever comes first."""


HandleFunction = Callable[[WorkerExecution], Awaitable[Any]]
"""Returns the result (any JSON value but None), or raises `WorkerFailure`."""


@attrs.frozen(kw_only=True)
class WorkerHandler:
    """An exact capability and the async function that runs tasks of it."""

    capability: Capability
    handle: HandleFunction


def _check_handlers(handlers: Sequence[WorkerHandler]) -> None:
    count = len(handlers)
    InvalidOption.check(
        1 <= count <= MAX_HANDLERS,
        field="handlers",
        value=count,
        allowed=f"from 1 to {MAX_HANDLERS} handlers",
    )
    seen: set[Capability] = set()
    for index, handler in enumerate(handlers):
        field = f"handlers[{index}]"
        InvalidOption.check(
            isinstance(handler, WorkerHandler),
            field=field,
            value=handler,
            allowed="must be a WorkerHandler(capability=..., handle=...)",
        )
        capability = handler.capability
        for part in ("handler", "handler_version", "payload_version"):
            value = getattr(capability, part, None)
            InvalidOption.check(
                isinstance(value, str) and 1 <= len(value) <= MAX_ID_CHARS,
                field=f"{field}.capability.{part}",
                value=value,
                allowed=f"a string of 1 to {MAX_ID_CHARS} characters",
            )
        InvalidOption.check(
            callable(handler.handle),
            field=f"{field}.handle",
            value=handler.handle,
            allowed="must be an async function taking a WorkerExecution",
        )
        InvalidOption.check(
            capability not in seen,
            field=f"{field}.capability",
            value=capability,
            allowed="each capability at most once",
        )
        seen.add(capability)


def _as_tuple(handlers: Iterable[WorkerHandler]) -> tuple[WorkerHandler, ...]:
    return tuple(handlers)


def _in_range(field: str, value: object, low: int, high: int, unit: str = "") -> None:
    InvalidOption.check(
        isinstance(value, int) and not isinstance(value, bool) and low <= value <= high,
        field=field,
        value=value,
        allowed=f"an integer from {low} to {high}{unit}",
    )


@attrs.frozen(kw_only=True)
class WorkerOptions:
    """An automatic worker's settings; see the README's "Automatic workers"."""

    queue_id: str
    handlers: tuple[WorkerHandler, ...] = attrs.field(converter=_as_tuple)
    capacity: int = DEFAULT_CAPACITY
    """Handlers that may run at once (one that ignores cancellation still holds its slot)."""
    shutdown_timeout_ms: int = DEFAULT_SHUTDOWN_TIMEOUT_MS
    """From the drain's start to giving up on what is still running or unconfirmed."""
    reconnect_min_delay_ms: int = DEFAULT_RECONNECT_MIN_MS
    reconnect_max_delay_ms: int = DEFAULT_RECONNECT_MAX_MS

    def __attrs_post_init__(self) -> None:
        InvalidOption.check(
            isinstance(self.queue_id, str)
            and 1 <= len(self.queue_id) <= MAX_ID_CHARS
            and _ID_FORM.fullmatch(self.queue_id) is not None,
            field="queue_id",
            value=self.queue_id,
            allowed=f"a queue id: 1 to {MAX_ID_CHARS} characters, no surrounding spaces",
        )
        _check_handlers(self.handlers)
        _in_range("capacity", self.capacity, 1, MAX_CAPACITY)
        _in_range("shutdown_timeout_ms", self.shutdown_timeout_ms, 1, MAX_SHUTDOWN_TIMEOUT_MS)
        _in_range(
            "reconnect_min_delay_ms",
            self.reconnect_min_delay_ms,
            MIN_RECONNECT_MIN_MS,
            MAX_RECONNECT_MAX_MS,
        )
        _in_range(
            "reconnect_max_delay_ms",
            self.reconnect_max_delay_ms,
            self.reconnect_min_delay_ms,
            MAX_RECONNECT_MAX_MS,
            " (not below reconnect_min_delay_ms)",
        )

    def handler_for(self, capability: Capability) -> WorkerHandler | None:
        for handler in self.handlers:
            if handler.capability == capability:
                return handler
        return None
