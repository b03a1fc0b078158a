"""Errors of the executor subsystem, split by who is at fault.

`WireError` and its subclasses are the peer's fault: bytes that arrived on an
executor socket are not a valid frame or message. `InvalidPoolConfig` and the
pool's `UnknownExecutor` / `ExecutorUnavailable` / `SendQueueFull` are the
local caller's fault. `CodeUnavailable` says why a call could not run inside
an executor; the child turns it into a call outcome.
This module imports only `blockx.errors`: the executor child imports it too.
"""

from __future__ import annotations

from blockx.errors import BlockxError, InvalidValue


class ExecutorError(BlockxError):
    """Base of every error of the executor subsystem."""


class WireError(ExecutorError):
    """The peer sent something that is not a valid frame or message."""


class FrameTooLarge(WireError):
    """A frame announced (or, when encoding, would need) more bytes than allowed."""

    def __init__(self, *, frame_bytes: int, max_frame_bytes: int) -> None:
        self.frame_bytes = frame_bytes
        self.max_frame_bytes = max_frame_bytes
        super().__init__(
            f"frame of {frame_bytes} bytes exceeds the limit of {max_frame_bytes} bytes"
        )


class MalformedFrame(WireError):
    """A complete frame whose payload is not a valid message.

    `message_type` is the frame's type tag when it could be read, else None.
    """

    def __init__(self, *, reason: str, message_type: str | None = None) -> None:
        self.reason = reason
        self.message_type = message_type
        where = f"{message_type!r} frame" if message_type is not None else "frame"
        super().__init__(f"malformed {where}: {reason}")


class UnknownMessageType(WireError):
    """A frame whose type tag names no message of this protocol."""

    def __init__(self, *, type_tag: object, known: tuple[str, ...]) -> None:
        self.type_tag = type_tag
        self.known = known
        super().__init__(f"unknown message type {type_tag!r}; known types: {', '.join(known)}")


class ProtocolViolation(WireError):
    """A valid message that the peer must not send in its role or at this point."""

    def __init__(self, *, executor_id: str, message_type: str, expected: str) -> None:
        self.executor_id = executor_id
        self.message_type = message_type
        self.expected = expected
        super().__init__(f"executor {executor_id!r} sent {message_type!r}; expected {expected}")


class CodeUnavailable(ExecutorError):
    """The worker could not supply the source of `module` for `epoch` (transient)."""

    def __init__(self, *, module: str, epoch: str, reason: str) -> None:
        self.module = module
        self.epoch = epoch
        self.reason = reason
        super().__init__(f"code of module {module!r} in epoch {epoch!r} is unavailable: {reason}")


class InvalidPoolConfig(ExecutorError, InvalidValue):
    """A pool setting is out of range. `field` is the configuration name."""


class UnknownExecutor(ExecutorError):
    """No executor of this pool has `executor_id`."""

    def __init__(self, *, executor_id: str, known: tuple[str, ...]) -> None:
        self.executor_id = executor_id
        self.known = known
        super().__init__(f"no executor {executor_id!r}; the pool has {', '.join(known)}")


class ExecutorUnavailable(ExecutorError):
    """The executor exists but has no live connection (its state says why)."""

    def __init__(self, *, executor_id: str, state: str) -> None:
        self.executor_id = executor_id
        self.state = state
        super().__init__(f"executor {executor_id!r} cannot take messages in state {state}")


class SendQueueFull(ExecutorError):
    """The executor's bounded send queue holds `capacity` frames already."""

    def __init__(self, *, executor_id: str, capacity: int) -> None:
        self.executor_id = executor_id
        self.capacity = capacity
        super().__init__(
            f"send queue of executor {executor_id!r} is full ({capacity} frames); "
            "batch calls into fewer RunCalls frames or wait for results"
        )


class RuntimeDirError(ExecutorError):
    """The private runtime directory or its socket path cannot be used."""

    def __init__(self, *, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"runtime path {path!r} cannot be used: {reason}")
