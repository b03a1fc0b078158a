"""The hub protocol: what an automatic worker and the hub say to each other over WebSocket.

Every WebSocket message is one binary frame holding a msgpack array of
messages; each message is a map whose `type` names it. A frame may carry
several messages (a worker may pipeline its control requests; the hub
answers in frames of whatever is ready), so nothing depends on how messages
are grouped. One attrs class per message and one cattrs converter for all.

The first message on a connection is `Hello` (protocol version, credential);
the hub answers `Welcome` or `Error` and closes. Then `OpenSession` names the
worker's instance, queue, capabilities and capacity; the hub answers with
the session TTL and starts sending `Offer`s of matching work, never more at
once than the capacity the worker last declared (`Heartbeat` renews the
session and declares the capacity). The worker runs an offered attempt only
after its `Start` is granted, `Renew`s the lease while it runs, and ends it
with `Finish` (SUCCEEDED with a JSON result, FAILED with a code, details and
whether a retry is safe, or UNKNOWN with a code). After a reconnect, `Resume`
names the attempts it still holds; `Drain` asks for no more offers.

Every control message (OpenSession, Start, Renew, Finish, Resume, Drain)
carries a `message_id` unique within the worker's instance; the hub answers
a repeated id with the answer it gave the first time (a receipt), so a
resend after a lost answer is harmless. A malformed frame is answered with
`Error` and the connection is closed.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Sequence
from typing import Any, Final, TypeAlias

import attrs
import cattrs
import msgpack  # type: ignore[import-untyped]  # ships no type information
from cattrs.strategies import configure_tagged_union

from blockx.errors import BlockxError

PROTOCOL_VERSION: Final = 1
MAX_FRAME_BYTES: Final = 1024 * 1024
"""Largest WebSocket message either side accepts."""
MAX_JSON_BYTES: Final = 256 * 1024
"""Largest result, details or payload JSON text."""
MAX_FRAME_MESSAGES: Final = 1024
MAX_ID_CHARS: Final = 128
MAX_CAPACITY: Final = 10_000
"""The most attempts one worker may hold at once."""
MAX_INT: Final = 2**63 - 1
"""Every integer in a message is from 0 to this (a database's BIGINT)."""
CODE_FORM: Final = re.compile(r"[A-Z][A-Z0-9_]{0,63}")
"""A failure code: upper-case letters, digits and underscores, starting with a letter."""
TYPE_KEY: Final = "type"


class ProtocolError(BlockxError):
    """A frame or message that is not this protocol; the connection is closed."""

    def __init__(self, *, reason: str) -> None:
        self.reason = reason
        super().__init__(f"not the hub protocol: {reason}")


class ErrorCode(enum.StrEnum):
    """Why the hub closes a connection (sent in `Error`)."""

    PROTOCOL_ERROR = "PROTOCOL_ERROR"
    """A malformed frame or a message out of order."""
    VERSION_MISMATCH = "VERSION_MISMATCH"
    AUTH_FAILED = "AUTH_FAILED"
    """Unknown or revoked credential."""
    PERMISSION_DENIED = "PERMISSION_DENIED"
    """The credential has no worker right on the queue."""
    MESSAGE_ID_REUSED = "MESSAGE_ID_REUSED"
    """A message id came again with a different message."""
    SESSION_EXPIRED = "SESSION_EXPIRED"
    """No message within the session TTL."""
    UNAVAILABLE = "UNAVAILABLE"
    """The hub is shutting down or cannot reach its database: reconnect later."""


class RefusalCode(enum.StrEnum):
    """Why a Start, Renew or Finish is refused (the connection stays open)."""

    UNKNOWN_ATTEMPT = "UNKNOWN_ATTEMPT"
    """No such attempt for this instance."""
    NOT_OFFERED = "NOT_OFFERED"
    """The attempt is no longer offered (withdrawn, or started by another instance)."""
    LEASE_LOST = "LEASE_LOST"
    """The attempt's lease ended, or the attempt is no longer the task's current one."""
    NOT_STARTED = "NOT_STARTED"
    """A Renew or Finish for an attempt whose Start was never granted."""
    TOO_LARGE = "TOO_LARGE"
    """A result or details above `MAX_JSON_BYTES`."""
    INVALID_REPORT = "INVALID_REPORT"
    """A result or details that is not JSON text, or a malformed failure code."""


class Disposition(enum.StrEnum):
    """What the hub made of a Finish."""

    ACCEPTED = "ACCEPTED"
    """It ended the attempt and decided the task's next state."""
    EVIDENCE_ONLY = "EVIDENCE_ONLY"
    """It arrived after the lease ended or contradicts the task's state: kept as
    evidence in the task's history, never counted as the task's outcome."""


class AttemptStatus(enum.StrEnum):
    """An attempt as `Resume` finds it."""

    OFFERED = "OFFERED"
    RUNNING = "RUNNING"
    LOST = "LOST"


# --- values ------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class Capability:
    """What a worker can run: an exact handler, its version and the payload version."""

    handler: str
    handler_version: str
    payload_version: str

    @property
    def key(self) -> str:
        """One string for the triple, as tasks are matched on it."""
        return f"{self.handler}\x1f{self.handler_version}\x1f{self.payload_version}"


@attrs.frozen(kw_only=True)
class AttemptRef:
    attempt_id: str
    epoch: int


@attrs.frozen(kw_only=True)
class Succeeded:
    result: str
    """JSON text of the result."""


@attrs.frozen(kw_only=True)
class Failed:
    code: str
    details: str = "{}"
    """JSON text."""
    retryable: bool = False
    """Whether running the task again is known to be safe and may succeed."""


@attrs.frozen(kw_only=True)
class Unknown:
    """Whether the attempt had its effect is not known (a handler error, a lost lease)."""

    code: str


Outcome: TypeAlias = Succeeded | Failed | Unknown


@attrs.frozen(kw_only=True)
class ResumedAttempt:
    attempt_id: str
    epoch: int
    status: AttemptStatus
    lease_deadline_ms: int = 0
    """For RUNNING: when the lease ends; for OFFERED: when the offer ends."""


# --- worker -> hub -------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class Hello:
    protocol_version: int
    credential: str


@attrs.frozen(kw_only=True)
class OpenSession:
    message_id: str
    instance_id: str
    queue_id: str
    capabilities: tuple[Capability, ...]
    capacity: int


@attrs.frozen(kw_only=True)
class Heartbeat:
    """The session is alive; `capacity` attempts may be held at once from now on."""

    capacity: int


@attrs.frozen(kw_only=True)
class Start:
    message_id: str
    attempt_id: str
    epoch: int


@attrs.frozen(kw_only=True)
class Renew:
    message_id: str
    attempt_id: str
    epoch: int


@attrs.frozen(kw_only=True)
class Finish:
    message_id: str
    attempt_id: str
    epoch: int
    outcome: Outcome


@attrs.frozen(kw_only=True)
class Resume:
    message_id: str
    attempts: tuple[AttemptRef, ...]


@attrs.frozen(kw_only=True)
class Drain:
    message_id: str


# --- hub -> worker -------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class Welcome:
    protocol_version: int
    hub_id: str


@attrs.frozen(kw_only=True)
class SessionOpened:
    reply_to: str
    session_ttl_ms: int


@attrs.frozen(kw_only=True)
class HeartbeatAck:
    session_ttl_ms: int


@attrs.frozen(kw_only=True)
class Offer:
    """Run this attempt (after a granted Start) before `offer_deadline_ms`."""

    attempt_id: str
    epoch: int
    task_id: str
    capability: Capability
    payload: str
    """JSON text."""
    offer_deadline_ms: int
    attempt_timeout_ms: int
    task_deadline_ms: int


@attrs.frozen(kw_only=True)
class Granted:
    """A Start or Renew granted: the attempt may run until `lease_deadline_ms`."""

    reply_to: str
    attempt_id: str
    lease_deadline_ms: int


@attrs.frozen(kw_only=True)
class Refused:
    reply_to: str
    attempt_id: str
    code: RefusalCode
    message: str


@attrs.frozen(kw_only=True)
class Recorded:
    reply_to: str
    attempt_id: str
    disposition: Disposition


@attrs.frozen(kw_only=True)
class Resumed:
    reply_to: str
    attempts: tuple[ResumedAttempt, ...]


@attrs.frozen(kw_only=True)
class DrainAck:
    """No more offers; `offered` are the attempts offered before this ack."""

    reply_to: str
    offered: tuple[str, ...]


@attrs.frozen(kw_only=True)
class Error:
    code: ErrorCode
    message: str


ToHub: TypeAlias = Hello | OpenSession | Heartbeat | Start | Renew | Finish | Resume | Drain
ControlMessage: TypeAlias = OpenSession | Start | Renew | Finish | Resume | Drain
"""Messages that carry a message id and are answered once, by receipt."""
ToWorker: TypeAlias = (
    Welcome
    | SessionOpened
    | HeartbeatAck
    | Offer
    | Granted
    | Refused
    | Recorded
    | Resumed
    | DrainAck
    | Error
)
Message: TypeAlias = ToHub | ToWorker
Answer: TypeAlias = SessionOpened | Granted | Refused | Recorded | Resumed | DrainAck

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
