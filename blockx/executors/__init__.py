"""Executor processes: the wire protocol, the child process and the pool manager.

The wire format (`_wire`) is pure and shared by both ends; the child
(`python -m blockx.executors.child`) is plain blocking Python; the pool manager
(`_pool`) is Trio. Must never make the child import trio: the pool manager's
names are loaded on first use, so importing this package stays light.
"""

from typing import TYPE_CHECKING, Any

from blockx.executors._config import ExecutorPoolConfig
from blockx.executors._errors import (
    CodeUnavailable,
    ExecutorError,
    ExecutorUnavailable,
    FrameTooLarge,
    InvalidPoolConfig,
    MalformedFrame,
    ProtocolViolation,
    RuntimeDirError,
    SendQueueFull,
    UnknownExecutor,
    UnknownMessageType,
    WireError,
)
from blockx.executors._health import RestartWindow, assess_health
from blockx.executors._model import (
    DownReason,
    ExecutorDown,
    ExecutorMessage,
    ExecutorState,
    ExecutorTransport,
    ExecutorUp,
    ExecutorView,
    PoolEvent,
)
from blockx.executors._wire import (
    MAX_FRAME_BYTES,
    PROTOCOL_VERSION,
    TOKEN_ENV,
    CallRequest,
    CallResults,
    CancelCall,
    CodeReply,
    CodeRequest,
    FrameDecoder,
    FromExecutor,
    Heartbeat,
    Hello,
    Message,
    RevokeCall,
    RunCalls,
    Shutdown,
    Subcall,
    SubcallResult,
    ToExecutor,
    Welcome,
    decode_payload,
    encode_frame,
    encode_frames,
    encode_payload,
    encode_run_calls_frame,
)

if TYPE_CHECKING:
    from blockx.executors._pool import ExecutorPoolManager


def __getattr__(name: str) -> Any:
    if name == "ExecutorPoolManager":
        from blockx.executors._pool import ExecutorPoolManager  # noqa: PLC0415 - keeps trio lazy

        return ExecutorPoolManager
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "MAX_FRAME_BYTES",
    "PROTOCOL_VERSION",
    "TOKEN_ENV",
    "CallRequest",
    "CallResults",
    "CancelCall",
    "CodeReply",
    "CodeRequest",
    "CodeUnavailable",
    "DownReason",
    "ExecutorDown",
    "ExecutorError",
    "ExecutorMessage",
    "ExecutorPoolConfig",
    "ExecutorPoolManager",
    "ExecutorState",
    "ExecutorTransport",
    "ExecutorUnavailable",
    "ExecutorUp",
    "ExecutorView",
    "FrameDecoder",
    "FrameTooLarge",
    "FromExecutor",
    "Heartbeat",
    "Hello",
    "InvalidPoolConfig",
    "MalformedFrame",
    "Message",
    "PoolEvent",
    "ProtocolViolation",
    "RestartWindow",
    "RevokeCall",
    "RunCalls",
    "RuntimeDirError",
    "SendQueueFull",
    "Shutdown",
    "Subcall",
    "SubcallResult",
    "ToExecutor",
    "UnknownExecutor",
    "UnknownMessageType",
    "Welcome",
    "WireError",
    "assess_health",
    "decode_payload",
    "encode_frame",
    "encode_frames",
    "encode_payload",
    "encode_run_calls_frame",
]
