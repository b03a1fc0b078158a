"""The hub protocol's codec: frames of msgpack messages, and the checks their types do not say.

Every WebSocket message is one binary frame holding a msgpack array of
messages; each message is a map whose `type` names it. One cattrs converter
for all; a wrong type on the wire is a malformed frame, never coerced.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Any, Final

import attrs
import cattrs
import msgpack  # type: ignore[import-untyped]  # ships no type information
from cattrs.strategies import configure_tagged_union

from blockx.errors import BlockxError
from blockx.hubwire._messages import (
    MAX_CAPACITY,
    MAX_FRAME_BYTES,
    MAX_FRAME_MESSAGES,
    MAX_ID_CHARS,
    MAX_INT,
    AttemptStatus,
    Disposition,
    Drain,
    DrainAck,
    Error,
    ErrorCode,
    Failed,
    Finish,
    Granted,
    Heartbeat,
    HeartbeatAck,
    Hello,
    Message,
    Offer,
    OpenSession,
    Outcome,
    Recorded,
    RefusalCode,
    Refused,
    Renew,
    Resume,
    Resumed,
    SessionOpened,
    Start,
    Succeeded,
    Unknown,
    Welcome,
)

TYPE_KEY: Final = "type"


class ProtocolError(BlockxError):
    """A frame or message that is not this protocol; the connection is closed."""

    def __init__(self, *, reason: str) -> None:
        self.reason = reason
        super().__init__(f"not the hub protocol: {reason}")


TAGS: Final[dict[type, str]] = {
    Hello: "hello",
    OpenSession: "open_session",
    Heartbeat: "heartbeat",
    Start: "start",
    Renew: "renew",
    Finish: "finish",
    Resume: "resume",
    Drain: "drain",
    Welcome: "welcome",
    SessionOpened: "session_opened",
    HeartbeatAck: "heartbeat_ack",
    Offer: "offer",
    Granted: "granted",
    Refused: "refused",
    Recorded: "recorded",
    Resumed: "resumed",
    DrainAck: "drain_ack",
    Error: "error",
    Succeeded: "succeeded",
    Failed: "failed",
    Unknown: "unknown",
}
_BY_TAG: Final = {tag: cls for cls, tag in TAGS.items()}


def _strict(expected: type[Any]) -> Any:
    # A wrong type on the wire is a malformed frame, never something to coerce.
    def structure(value: object, _type: type[Any]) -> object:
        if type(value) is not expected:
            raise TypeError(f"expected {expected.__name__}, got {type(value).__name__}")
        return value

    return structure


def _number(value: object, _type: type[Any]) -> int:
    # Every integer is an epoch, a time or a count: a database BIGINT, never negative.
    if type(value) is not int:
        raise TypeError(f"expected int, got {type(value).__name__}")
    if not 0 <= value <= MAX_INT:
        raise ValueError(f"must be from 0 to {MAX_INT}, not {value}")
    return value


def _choice(value: object, type_: type[enum.StrEnum]) -> enum.StrEnum:
    if type(value) is not str:
        raise TypeError(f"expected str, got {type(value).__name__}")
    try:
        return type_(value)
    except ValueError:
        raise ValueError(f"{value!r} is none of {', '.join(type_)}") from None


def _make_converter() -> cattrs.Converter:
    converter = cattrs.Converter(forbid_extra_keys=True)
    converter.register_structure_hook(str, _strict(str))
    converter.register_structure_hook(bool, _strict(bool))
    converter.register_structure_hook(int, _number)
    for choice in (ErrorCode, RefusalCode, Disposition, AttemptStatus):
        # Each by name: the hook for str would otherwise take these str subclasses too.
        converter.register_structure_hook(choice, _choice)
    configure_tagged_union(
        Outcome,
        converter,
        tag_name=TYPE_KEY,
        tag_generator=lambda cls: TAGS[cls],
    )
    return converter


CONVERTER: Final = _make_converter()
"""The one converter of this protocol."""


def encode_message(message: Message) -> bytes:
    """One message, msgpack-encoded on its own: what `frame` puts together."""
    fields: dict[str, object] = CONVERTER.unstructure(message)
    fields[TYPE_KEY] = TAGS[type(message)]
    packed: bytes = msgpack.packb(fields)
    return packed


def frame(encoded: Sequence[bytes]) -> bytes:
    """One frame of messages already encoded by `encode_message` (a msgpack array of them)."""
    count = len(encoded)
    assert count <= MAX_FRAME_MESSAGES, count
    header = bytes([0x90 | count]) if count < 16 else b"\xdc" + count.to_bytes(2, "big")
    return header + b"".join(encoded)


def encode(messages: Sequence[Message]) -> bytes:
    """One frame carrying `messages`."""
    return frame([encode_message(message) for message in messages])


def decode(frame: bytes | bytearray | memoryview | str) -> list[Message]:
    """The messages in one frame; `ProtocolError` naming what is wrong otherwise."""
    if not isinstance(frame, bytes | bytearray | memoryview):
        raise ProtocolError(reason="frames are binary (msgpack), not text")
    if len(frame) > MAX_FRAME_BYTES:
        raise ProtocolError(reason=f"frame of {len(frame)} bytes; at most {MAX_FRAME_BYTES}")
    try:
        items = msgpack.unpackb(frame)
    except (ValueError, TypeError, msgpack.UnpackException) as error:
        raise ProtocolError(reason=f"frame is not msgpack ({error})") from error
    if not isinstance(items, list) or not items or len(items) > MAX_FRAME_MESSAGES:
        raise ProtocolError(
            reason=f"a frame is an array of 1 to {MAX_FRAME_MESSAGES} messages, "
            f"not {type(items).__name__}"
        )
    return [_message(item, index) for index, item in enumerate(items)]


def _message(item: object, index: int) -> Message:
    if not isinstance(item, dict):
        raise ProtocolError(reason=f"message {index} is a {type(item).__name__}, not a map")
    fields = dict(item)
    tag = fields.pop(TYPE_KEY, None)
    cls = _BY_TAG.get(tag) if isinstance(tag, str) else None
    if cls is None or cls in (Succeeded, Failed, Unknown):
        known = ", ".join(tag for cls, tag in TAGS.items() if cls not in _OUTCOMES)
        raise ProtocolError(reason=f"message {index} has type {tag!r}; known: {known}")
    try:
        message: Message = CONVERTER.structure(fields, cls)
    except cattrs.BaseValidationError as error:
        reasons = "; ".join(cattrs.transform_error(error, format_exception=_reason))
        raise ProtocolError(reason=f"{tag} message {index}: {reasons}") from error
    except (TypeError, ValueError) as error:
        raise ProtocolError(reason=f"{tag} message {index}: {error}") from error
    check(message)
    return message


_OUTCOMES: Final = (Succeeded, Failed, Unknown)


def _reason(error: BaseException, type_: type | None) -> str:
    if isinstance(error, TypeError | ValueError) and str(error):
        return str(error)
    if isinstance(error, AttributeError):
        return "expected a map"
    return cattrs.v.format_exception(error, type_)


def check(message: Message) -> None:
    """`ProtocolError` if a decoded message breaks a rule its types do not say."""
    for name in _ID_FIELDS[type(message)]:
        if not 0 < len(getattr(message, name)) <= MAX_ID_CHARS:
            raise ProtocolError(reason=f"{name} must have 1 to {MAX_ID_CHARS} characters")
    match message:
        case OpenSession(capacity=capacity) | Heartbeat(capacity=capacity) if (
            capacity > MAX_CAPACITY
        ):
            raise ProtocolError(reason=f"capacity must be at most {MAX_CAPACITY}, not {capacity}")
        case OpenSession(capabilities=capabilities) if not capabilities:
            raise ProtocolError(reason="a session needs at least one capability")
        case _:
            pass


_ID_FIELDS: Final = {
    cls: tuple(
        field.name
        for field in attrs.fields(cls)
        if field.name in ("message_id", "instance_id", "attempt_id", "queue_id")
    )
    for cls in TAGS
}
