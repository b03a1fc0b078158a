"""The API that function code uses inside an executor: `subcall` and `RetryableError`.

Owns the bridge from function code to the executor process that runs it: the
executor binds a `SubcallPort` for its main thread, and `subcall` finds it.
Must stay importable from anywhere (the package root re-exports it): it imports
only the standard library and `blockx.errors`, never msgpack, trio or the
executor machinery.
"""

from __future__ import annotations

import contextvars
from typing import Any, Protocol

from blockx.errors import BlockxError


class RetryableError(BlockxError):
    """Raise from function code to fail the call as retryable (`CALL_RAISED_RETRYABLE`).

    Any other exception fails the call for good (`CALL_RAISED`).
    """

    def __init__(self, message: str = "") -> None:
        self.message = message
        super().__init__(message)


class NotInExecutor(BlockxError):
    """`subcall` was used outside a call running on an executor's main thread."""

    def __init__(self, *, function: str) -> None:
        self.function = function
        super().__init__(
            f"subcall({function!r}) works only inside a function that an executor is "
            "running, on the executor's main thread"
        )


class SubcallFailed(BlockxError):
    """The subcall ran and failed. If the calling function lets it propagate, its own
    call fails too, retryable exactly when the subcall's failure was."""

    def __init__(
        self, *, function: str, error_code: str, error_message: str, retryable: bool
    ) -> None:
        self.function = function
        self.error_code = error_code
        self.error_message = error_message
        self.retryable = retryable
        super().__init__(f"subcall {function!r} failed with {error_code}: {error_message}")


class CallCancelled(BlockxError):
    """The worker cancelled the running call while it waited on a subcall."""

    def __init__(self, *, call_id: str) -> None:
        self.call_id = call_id
        super().__init__(f"call {call_id!r} was cancelled")


class SubcallPort(Protocol):
    """What an executor offers `subcall`: run a function elsewhere and wait for it."""

    def subcall(self, function: str, args: tuple[object, ...], kwargs: dict[str, object]) -> Any:
        """The decoded value of the subcall; raises SubcallFailed or CallCancelled."""
        ...


_port: contextvars.ContextVar[SubcallPort | None] = contextvars.ContextVar(
    "blockx_subcall_port", default=None
)


def bind_subcall_port(port: SubcallPort) -> None:
    """Make `port` serve `subcall` in the current context (the executor's main thread)."""
    _port.set(port)


def subcall(function: str, /, *args: object, **kwargs: object) -> Any:
    """Run `function` ("module.function", same epoch) with msgpack-able arguments on
    the executor pool and return its value. Blocks this call; meanwhile the executor
    keeps running other calls, so chains of subcalls of any depth complete."""
    port = _port.get()
    if port is None:
        raise NotInExecutor(function=function)
    return port.subcall(function, args, kwargs)
