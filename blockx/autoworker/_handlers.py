"""Handlers: how they are declared, what they get, and how their ending is reported.

`WorkerOptions` (queue, capacity, handlers, timings) is checked when made, so a
worker that starts has a valid configuration; a bad value raises
`InvalidOption` naming the option.

How a handler's ending becomes the outcome reported to the hub:

| the handler                                  | reported                            |
|----------------------------------------------|-------------------------------------|
| returned a JSON value (not None)             | SUCCEEDED with it                   |
| raised `WorkerFailure(code, details, ...)`   | FAILED with them                    |
| raised `OutcomeUnknown(code)`                | UNKNOWN with it                     |
| raised anything else                         | UNKNOWN / HANDLER_ERROR             |
| raised a crash-like BaseException            | UNKNOWN / HANDLER_PANIC or _ABORTED |
| returned something the hub cannot take       | UNKNOWN / INVALID_HANDLER_RESULT    |
| was cancelled (lease lost, drain overran)    | UNKNOWN / LEASE_LOST                |

A result (or failure details) is checked before it is sent by the rules the
hub checks it by (`blockx.hubwire.parse_json`), so a report the hub would
refuse for ever is never made. A handler may return a `RawJson` (or hold one
in what it returns) to send a text exactly as it is, and `decimal.Decimal`s
are written exactly. The exception's own text is never sent: it may hold
anything.

A handler gets the payload as the producer wrote it (`payload_text`) and
decoded (`payload`): numbers with a fraction or an exponent as floats, or as
`decimal.Decimal`s for a handler declared with `decimals=True`.
"""

from __future__ import annotations

import functools
import inspect
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Final, Protocol, TypeVar

import attrs

from blockx.errors import BlockxError, InvalidValue
from blockx.hubwire import (
    CODE_FORM,
    MAX_ID_CHARS,
    Capability,
    Failed,
    InvalidJson,
    Outcome,
    Succeeded,
    Unknown,
    dumps,
    parse_json,
)

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


class AttemptCancelled(BlockxError):
    """Raised by `WorkerExecution.raise_if_cancelled` once the attempt is cancelled."""

    def __init__(self, attempt_id: str) -> None:
        self.attempt_id = attempt_id
        super().__init__(f"attempt {attempt_id} was cancelled: its lease is lost or the drain over")


class CancelSignal(Protocol):
    """What `WorkerExecution` reads its cancellation from, from any thread (the runtime
    gives a `threading.Event`, which it sets)."""

    def is_set(self) -> bool: ...

    def wait(self, timeout: float | None = None) -> bool: ...


@attrs.frozen(kw_only=True)
class WorkerExecution:
    """What a handler gets for one attempt: never the worker's credential or secrets.

    `task_id` is the key to make effects idempotent across attempts; `attempt_id`
    names this attempt only; `epoch` grows with every attempt of the task, so a
    resource that checks it can refuse writes of an older attempt.

    The attempt is cancelled when its lease is lost or the drain outlasts the shutdown
    timeout. A plain handler, in its thread, sees it through `cancelled`,
    `wait_cancelled` and `raise_if_cancelled`, and should stop soon: until it returns,
    it keeps its slot. An async handler is cancelled as Trio does (`trio.Cancelled` at
    its next `await`) and may read `cancelled` too.
    """

    task_id: str
    attempt_id: str
    epoch: int
    capability: Capability
    payload: Any
    """The task's payload, decoded from JSON (see `WorkerHandler.decimals`)."""
    payload_text: str
    """The task's payload: the JSON text exactly as the producer wrote it."""
    attempt_deadline_ms: int
    """When this attempt must end at the latest (epoch ms): the attempt timeout or the
    task's deadline, whichever comes first."""
    _cancel_signal: CancelSignal = attrs.field(repr=False, eq=False)

    @property
    def cancelled(self) -> bool:
        """Whether the attempt is cancelled (it never becomes uncancelled)."""
        return self._cancel_signal.is_set()

    def wait_cancelled(self, timeout_s: float | None = None) -> bool:
        """Blocks the calling thread until the attempt is cancelled or `timeout_s` passed;
        whether it is cancelled. For plain handlers: never call it on the Trio thread."""
        return self._cancel_signal.wait(timeout_s)

    def raise_if_cancelled(self) -> None:
        """`AttemptCancelled` if the attempt is cancelled: a plain handler's checkpoint."""
        if self.cancelled:
            raise AttemptCancelled(self.attempt_id)


CAPABILITY_ATTRIBUTE: Final = "capability"
"""The attribute of a handler function that names its `Capability` (`handles` sets it)."""
DEFAULT_VERSION: Final = "v1"

_F = TypeVar("_F", bound=Callable[..., Any])


def handles(
    handler: str, *, handler_version: str = DEFAULT_VERSION, payload_version: str = DEFAULT_VERSION
) -> Callable[[_F], _F]:
    """Declares the capability a function handles, for `blockx autoworker`:

    @handles("text.normalize", handler_version="v2")
    def normalize(execution: WorkerExecution) -> dict[str, str]: ...
    """

    def declare(function: _F) -> _F:
        declared = Capability(
            handler=handler, handler_version=handler_version, payload_version=payload_version
        )
        setattr(function, CAPABILITY_ATTRIBUTE, declared)
        return function

    return declare


HandleFunction = Callable[[WorkerExecution], Any]
"""Returns the result (any JSON value but None, `RawJson` for a text sent as it is), or
raises `WorkerFailure`; an async function, or a plain one that runs in a worker thread."""


@attrs.frozen(kw_only=True)
class WorkerHandler:
    """An exact capability and the function that runs tasks of it."""

    capability: Capability
    handle: HandleFunction
    decimals: bool = False
    """The payload's numbers with a fraction or an exponent are `decimal.Decimal`s,
    exactly as written (`1.10` stays `Decimal("1.10")`), not floats."""

    def payload_of(self, text: str) -> Any:
        """The payload this handler gets for the JSON text `text` (`InvalidJson`, a
        `ValueError`, if it breaks the protocol's rules)."""
        return parse_json(text, "payload", decimals=self.decimals)

    @property
    def in_thread(self) -> bool:
        """Whether `handle` is a plain callable, run in a worker thread, rather than an
        async one (a coroutine function, an object whose `__call__` is one, or a
        `functools.partial` of either), run on the Trio thread."""
        handle: Any = self.handle
        while isinstance(handle, functools.partial):
            handle = handle.func
        called = type(handle).__call__  # what calling an object runs is its type's
        return not (inspect.iscoroutinefunction(handle) or inspect.iscoroutinefunction(called))


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
            allowed="a function taking a WorkerExecution, async or plain (run in a thread)",
        )
        InvalidOption.check(
            isinstance(handler.decimals, bool),
            field=f"{field}.decimals",
            value=handler.decimals,
            allowed="True or False",
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


HANDLER_ERROR: Final = "HANDLER_ERROR"
HANDLER_PANIC: Final = "HANDLER_PANIC"
HANDLER_ABORTED: Final = "HANDLER_ABORTED"
INVALID_HANDLER_RESULT: Final = "INVALID_HANDLER_RESULT"
LEASE_LOST: Final = "LEASE_LOST"


class WorkerFailure(BlockxError):
    """Raise from a handler to fail the attempt on purpose.

    `code` matches `[A-Z][A-Z0-9_]{0,63}`; `details` is any JSON value (an empty
    object when None; a `RawJson` is sent as it is); `retryable` says running the
    task again is safe and may succeed (the hub still applies the task's attempts
    and deadline).
    """

    def __init__(self, code: str, details: Any = None, *, retryable: bool = False) -> None:
        self.code = code
        self.details = {} if details is None else details
        self.retryable = retryable
        super().__init__(f"{code} (retryable: {retryable})")


class OutcomeUnknown(BlockxError):
    """Raise from a handler that cannot tell whether the attempt had its effect (it may
    have written part of it): reported UNKNOWN with `code` (`[A-Z][A-Z0-9_]{0,63}`), so
    the hub runs an idempotent task again and sends any other to review."""

    def __init__(self, code: str) -> None:
        self.code = code
        super().__init__(f"{code} (the attempt may have had its effect)")


def json_text(value: Any, name: str = "result") -> str:
    """`value` as JSON text the hub takes as `name` (result or details), or `InvalidJson`
    naming the path of what it would refuse."""
    text = dumps(value, name=name)
    parse_json(text, name)
    return text


def returned(value: Any) -> Outcome:
    """The outcome of a handler that returned `value`."""
    if value is None:
        return Unknown(code=INVALID_HANDLER_RESULT)
    try:
        return Succeeded(result=json_text(value))
    except InvalidJson:
        return Unknown(code=INVALID_HANDLER_RESULT)


def raised(error: BaseException) -> Outcome:
    """The outcome of a handler that raised `error` (never its text)."""
    if isinstance(error, WorkerFailure):
        return _failure(error)
    if isinstance(error, OutcomeUnknown):
        valid = isinstance(error.code, str) and CODE_FORM.fullmatch(error.code)
        return Unknown(code=error.code if valid else INVALID_HANDLER_RESULT)
    if isinstance(error, Exception):
        return Unknown(code=HANDLER_ERROR)
    if isinstance(error, (SystemExit, GeneratorExit)):
        return Unknown(code=HANDLER_ABORTED)
    return Unknown(code=HANDLER_PANIC)


def _failure(error: WorkerFailure) -> Outcome:
    if not isinstance(error.code, str) or not CODE_FORM.fullmatch(error.code):
        return Unknown(code=INVALID_HANDLER_RESULT)
    try:
        details = json_text(error.details, "details")
    except InvalidJson:
        return Unknown(code=INVALID_HANDLER_RESULT)
    return Failed(code=error.code, details=details, retryable=bool(error.retryable))


def lease_lost() -> Outcome:
    return Unknown(code=LEASE_LOST)
