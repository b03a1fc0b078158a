"""The executor wire protocol: frames, messages and the one converter both ends use.

Owns the bytes between the worker and its executor processes. A frame is a
4-byte big-endian payload length followed by a msgpack map whose `type` key
names the message; the other keys are the message's fields. Call arguments and
values travel as opaque msgpack bytes inside the messages (the codec of
`blockx.calls`), so the frame schema never depends on what a function takes or
returns. A call attempt is named by (call id, attempt) both ways, and its end
travels as the `CallOutcome` every layer of the worker uses.

Must never do I/O, read a clock or import trio: the executor child imports this
module and stays a plain blocking program. Bad input never escapes as anything
but a `WireError` that names what is wrong.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Final, TypeAlias

import attrs
import cattrs
import msgpack  # type: ignore[import-untyped]  # ships no type information

from blockx.calls import CallOutcome, FailureCode, Succeeded
from blockx.errors import BlockxError
from blockx.executors._errors import FrameTooLarge, MalformedFrame, UnknownMessageType

PROTOCOL_VERSION: Final = 4
"""Raised whenever a message is added or changes shape (3: RevokeCall; 4: successes in
bulk in CallResults, calls as arrays in RunCalls)."""
HEADER_BYTES: Final = 4
MAX_FRAME_BYTES: Final = 64 * 1024 * 1024
"""Largest frame payload either end sends or accepts (64 MiB)."""
RECV_BYTES: Final = 64 * 1024
"""Bytes either end asks of its socket per read. Kept under glibc's mmap threshold
(128 KiB): `recv(n)` allocates n bytes first, and a larger request is a fresh
mapping per read, measured at 9.5 us a read against 1 us for 64 KiB."""

TOKEN_ENV: Final = "BLOCKX_EXECUTOR_TOKEN"
"""Environment variable that hands an executor its token (never argv: `ps` shows argv)."""

TYPE_KEY: Final = "type"


# --- messages -----------------------------------------------------------------


@attrs.frozen(kw_only=True)
class Hello:
    """Executor → worker, first frame: who I am and the token I was given."""

    executor_id: str
    pid: int
    token: str
    protocol_version: int


@attrs.frozen(kw_only=True)
class Welcome:
    """Worker → executor, answer to an accepted Hello: how to behave."""

    heartbeat_interval_ms: int
    max_result_bytes: int


@attrs.frozen(kw_only=True)
class Heartbeat:
    """Executor → worker, every `heartbeat_interval_ms`.

    `loop_progress_age_ms` is measured by the executor itself: how long ago its
    main loop last took up work or was idle waiting. A call stuck in a loop
    shows a growing age with `running_call_id` set.
    """

    running_call_id: str | None
    loop_progress_age_ms: int
    rss_bytes: int
    calls_served: int


@attrs.frozen(kw_only=True)
class CallRequest:
    """One attempt of a call: run `function` ("module.function") of `epoch` with `args`.

    `args` is `blockx.calls.encode_args` bytes; `deadline_ms_from_now` None = no
    deadline. The executor never starts a call whose deadline has passed.
    """

    call_id: str
    attempt: int
    task_id: str
    epoch: str
    function: str
    args: bytes
    deadline_ms_from_now: int | None = None


@attrs.frozen(kw_only=True)
class RunCalls:
    """Worker → executor: calls to run in order, several per frame. On the wire each
    call is an array of CallRequest's fields in their order, not a map: this frame
    carries most of a worker's traffic."""

    calls: tuple[CallRequest, ...]


@attrs.frozen(kw_only=True)
class CallResults:
    """Executor → worker: call attempts that finished, several per frame.

    Successes travel as `succeeded` rows, flattened into one array on the wire (call
    id, attempt, value, call id, ...), so a frame of many is decoded without a map and
    an outcome object each; failures, and successes an older sender puts there, as
    `results`."""

    results: tuple[CallOutcome, ...] = ()
    succeeded: tuple[Succeeded, ...] = ()

    def outcomes(self) -> tuple[CallOutcome, ...]:
        """Every attempt of the frame as an outcome, the successes first: for readers
        off the hot path."""
        made = (CallOutcome.success(call_id=c, attempt=a, value=v) for c, a, v in self.succeeded)
        return (*made, *self.results)


@attrs.frozen(kw_only=True)
class CancelCall:
    """Worker → executor: drop the attempt if queued; abort its subcall wait if running."""

    call_id: str
    attempt: int


@attrs.frozen(kw_only=True)
class RevokeCall:
    """Worker → executor: give the attempt back if it has not started (answered with a
    CALL_REVOKED outcome); if it has started or finished, ignore this."""

    call_id: str
    attempt: int


@attrs.frozen(kw_only=True)
class CodeRequest:
    """Executor → worker: the source text of `module` in `epoch`, please."""

    request_id: str
    epoch: str
    module: str


@attrs.frozen(kw_only=True)
class CodeReply:
    """Worker → executor: `source`, or None with `error` None when there is no such
    module, or None with `error` set when the source could not be read."""

    request_id: str
    source: str | None
    error: str | None = None


@attrs.frozen(kw_only=True)
class Subcall:
    """Executor → worker: run `function` with `args` on behalf of the running attempt
    (`parent_call_id`, `parent_attempt`) and send its final outcome back."""

    subcall_id: str
    parent_call_id: str
    parent_attempt: int
    function: str
    args: bytes


@attrs.frozen(kw_only=True)
class SubcallResult:
    """Worker → executor: the final outcome of a subcall; `outcome.call_id` is its `subcall_id`."""

    outcome: CallOutcome


@attrs.frozen(kw_only=True)
class Shutdown:
    """Worker → executor: finish the running call, report, and exit."""


Message: TypeAlias = (
    Hello
    | Welcome
    | Heartbeat
    | RunCalls
    | CallResults
    | CancelCall
    | RevokeCall
    | CodeRequest
    | CodeReply
    | Subcall
    | SubcallResult
    | Shutdown
)
FromExecutor: TypeAlias = Hello | Heartbeat | CallResults | CodeRequest | Subcall
"""What an executor sends."""
ToExecutor: TypeAlias = RunCalls | CancelCall | RevokeCall | CodeReply | SubcallResult | Shutdown
"""What the worker's dispatcher may send to an executor (Welcome is the pool's own)."""

MESSAGE_TAGS: Final[Mapping[type[Message], str]] = {
    Hello: "hello",
    Welcome: "welcome",
    Heartbeat: "heartbeat",
    RunCalls: "run_calls",
    CallResults: "call_results",
    CancelCall: "cancel_call",
    RevokeCall: "revoke_call",
    CodeRequest: "code_request",
    CodeReply: "code_reply",
    Subcall: "subcall",
    SubcallResult: "subcall_result",
    Shutdown: "shutdown",
}
_TYPE_BY_TAG: Final[Mapping[str, type[Message]]] = {tag: t for t, tag in MESSAGE_TAGS.items()}
_KNOWN_TAGS: Final = tuple(MESSAGE_TAGS.values())


# --- the converter ----------------------------------------------------------------


def _strict(expected: type[Any]) -> Callable[[object, type[Any]], object]:
    # cattrs' default hooks coerce (str(3) == "3", int(True) == 1); on a wire
    # a wrong type is a malformed frame, never something to repair.
    def structure(value: object, _type: type[Any]) -> object:
        if type(value) is not expected:
            raise TypeError(f"expected {expected.__name__}, got {type(value).__name__}")
        return value

    return structure


def _flat_hook(
    cls: type[Any], convert: Mapping[str, Callable[[Any], object]] | None = None
) -> Callable[[object, type[Any]], object]:
    """A strict structure hook for a class whose fields are primitives or optional ones.

    Same checks as the generic path (exact types, no extra or missing keys) at a
    fraction of its cost: these classes travel once per call. A field named in
    `convert` is turned into its type by that function instead (an enum from its
    value); whatever it raises makes the frame malformed.
    """
    convert = convert or {}
    fields = attrs.fields(attrs.resolve_types(cls))
    checks = tuple(
        (field.name, tuple(getattr(field.type, "__args__", (field.type,))))
        for field in fields
        if field.name not in convert
    )
    names = frozenset(field.name for field in fields)
    required = frozenset(f.name for f in fields if f.default is attrs.NOTHING)

    def structure(value: object, _type: type[Any]) -> object:
        if type(value) is not dict:
            raise TypeError(f"{cls.__name__}: expected a map, got {type(value).__name__}")
        if not names.issuperset(value) or not required.issubset(value):
            raise TypeError(f"{cls.__name__}: keys {sorted(value)} do not match {sorted(names)}")
        for name, allowed in checks:
            if name in value and type(value[name]) not in allowed:
                raise TypeError(f"{cls.__name__}.{name}: unexpected {type(value[name]).__name__}")
        for name, to_type in convert.items():
            if value.get(name) is not None:
                value[name] = to_type(value[name])
        return cls(**value)

    return structure


def _reason(error: BaseException, _type: type | None) -> str:
    """What is wrong, in words: the text of the hooks' own errors, cattrs' otherwise."""
    if isinstance(error, TypeError | ValueError | BlockxError) and str(error):
        return str(error)
    return cattrs.v.format_exception(error, _type)


def _failure_code(value: object) -> FailureCode:
    if type(value) is not str:
        raise TypeError(f"error_code: expected a string, got {type(value).__name__}")
    try:
        return FailureCode(value)
    except ValueError:
        raise ValueError(f"error_code {value!r} is not a failure code") from None


def _structure_call_results(value: object, _type: type[Any]) -> CallResults:
    if type(value) is not dict:
        raise TypeError(f"CallResults: expected a map, got {type(value).__name__}")
    if not value.keys() <= {"results", "succeeded"}:
        raise TypeError(f"CallResults: keys {sorted(value)} are not results and succeeded")
    flat = value.get("succeeded", [])
    if type(flat) is not list or len(flat) % 3:
        raise TypeError("CallResults.succeeded: expected an array of (call id, attempt, value)")
    call_ids, attempts, values = flat[0::3], flat[1::3], flat[2::3]
    # Checked a column at a time: these frames carry most of the executors' traffic.
    if not (
        set(map(type, call_ids)) <= {str}
        and set(map(type, attempts)) <= {int}
        and set(map(type, values)) <= {bytes}
        and all(values)
    ):
        raise TypeError(_bad_success(flat))
    return CallResults(
        results=_outcomes(value.get("results", [])),
        succeeded=tuple(zip(call_ids, attempts, values, strict=True)),
    )


def _bad_success(flat: list[object]) -> str:
    """What is wrong with the first bad row of a flattened `succeeded` array."""
    for start in range(0, len(flat), 3):
        row = flat[start : start + 3]
        if [*map(type, row)] != [str, int, bytes] or not row[2]:
            got = [type(f).__name__ if f != b"" else "empty bytes" for f in row]
            return (
                f"a success is (string, integer, non-empty bytes), got {got} @ $.succeeded[{start}]"
            )
    raise AssertionError("no bad row")  # only called once a column check failed


def _outcomes(results: object) -> tuple[CallOutcome, ...]:
    if type(results) is not list:
        raise TypeError(f"CallResults.results: expected an array, got {type(results).__name__}")
    structure = CONVERTER.get_structure_hook(CallOutcome)
    outcomes = []
    for index, result in enumerate(results):
        try:
            outcomes.append(structure(result, CallOutcome))
        except (TypeError, ValueError, BlockxError) as exc:
            raise TypeError(f"{exc} @ $.results[{index}]") from exc
    return tuple(outcomes)


_REQUEST_TYPES: Final = (
    (str,),
    (int,),
    (str,),
    (str,),
    (str,),
    (bytes,),
    (int, type(None)),
)
_REQUEST_FIELDS: Final = tuple(field.name for field in attrs.fields(CallRequest))


def _structure_run_calls(value: object, _type: type[Any]) -> RunCalls:
    if type(value) is not dict or value.keys() != {"calls"}:
        raise TypeError("RunCalls: expected a map whose one key is calls")
    if type(value["calls"]) is not list:
        raise TypeError(f"expected an array, got {type(value['calls']).__name__} @ $.calls")
    rows = value["calls"]
    # Checked a column at a time; the loop that names the fault runs only on one.
    width = len(_REQUEST_TYPES)
    if not (
        all(type(row) is list and len(row) == width for row in rows)
        and all(
            set(map(type, column)) <= set(allowed)
            for column, allowed in zip(zip(*rows, strict=True), _REQUEST_TYPES, strict=False)
        )
    ):
        raise TypeError(_bad_request(rows))
    return RunCalls(
        calls=tuple(
            CallRequest(
                call_id=call_id,
                attempt=attempt,
                task_id=task_id,
                epoch=epoch,
                function=function,
                args=args,
                deadline_ms_from_now=deadline,
            )
            for call_id, attempt, task_id, epoch, function, args, deadline in rows
        )
    )


def _bad_request(rows: list[object]) -> str:
    """What is wrong with the first bad call of a RunCalls array."""
    for index, row in enumerate(rows):
        if type(row) is not list or len(row) != len(_REQUEST_TYPES):
            return f"a call is an array of {len(_REQUEST_TYPES)} fields @ $.calls[{index}]"
        for field, allowed, name in zip(row, _REQUEST_TYPES, _REQUEST_FIELDS, strict=True):
            if type(field) not in allowed:
                return f"{name}: unexpected {type(field).__name__} @ $.calls[{index}]"
    raise AssertionError("no bad call")  # only called once a check failed


def _unstructure_run_calls(message: RunCalls) -> dict[str, object]:
    return {"calls": [list(attrs.astuple(call)) for call in message.calls]}


def _unstructure_call_results(message: CallResults) -> dict[str, object]:
    outcome = CONVERTER.get_unstructure_hook(CallOutcome)
    return {
        "results": [outcome(result) for result in message.results],
        "succeeded": [field for row in message.succeeded for field in row],
    }


def _make_converter() -> cattrs.Converter:
    converter = cattrs.Converter(forbid_extra_keys=True)
    for primitive in (str, int, bytes, bool):
        converter.register_structure_hook(primitive, _strict(primitive))
    converter.register_structure_hook(CallRequest, _flat_hook(CallRequest))
    converter.register_structure_hook(
        CallOutcome, _flat_hook(CallOutcome, {"error_code": _failure_code})
    )
    converter.register_structure_hook(RunCalls, _structure_run_calls)
    converter.register_unstructure_hook(RunCalls, _unstructure_run_calls)
    converter.register_structure_hook(CallResults, _structure_call_results)
    converter.register_unstructure_hook(CallResults, _unstructure_call_results)
    return converter


CONVERTER: Final = _make_converter()
"""The one cattrs converter of this wire format, shared by worker and executor."""

_UNSTRUCTURE: Final = {t: CONVERTER.get_unstructure_hook(t) for t in MESSAGE_TAGS}
_STRUCTURE: Final = {t: CONVERTER.get_structure_hook(t) for t in MESSAGE_TAGS}


# --- frames ------------------------------------------------------------------------


def encode_payload(message: Message) -> bytes:
    """The msgpack payload of `message` (a frame without its length header)."""
    mapping: dict[str, object] = _UNSTRUCTURE[type(message)](message)
    mapping[TYPE_KEY] = MESSAGE_TAGS[type(message)]
    payload: bytes = msgpack.packb(mapping)
    return payload


def encode_frame(message: Message, *, max_frame_bytes: int = MAX_FRAME_BYTES) -> bytes:
    """One complete frame. Raises `FrameTooLarge` rather than send what the peer refuses."""
    payload = encode_payload(message)
    if len(payload) > max_frame_bytes:
        raise FrameTooLarge(frame_bytes=len(payload), max_frame_bytes=max_frame_bytes)
    return len(payload).to_bytes(HEADER_BYTES, "big") + payload


def encode_run_calls_frame(
    calls: Iterable[tuple[str, int, str, str, str, bytes, int | None]],
    *,
    max_frame_bytes: int = MAX_FRAME_BYTES,
) -> bytes:
    """`encode_frame(RunCalls(calls=...))` from (call_id, attempt, task_id, epoch, function,
    args, deadline_ms_from_now) tuples, byte for byte, without building a CallRequest
    per call: this frame carries most of a worker's traffic."""
    mapping = {"calls": list(calls), TYPE_KEY: MESSAGE_TAGS[RunCalls]}
    payload: bytes = msgpack.packb(mapping)
    if len(payload) > max_frame_bytes:
        raise FrameTooLarge(frame_bytes=len(payload), max_frame_bytes=max_frame_bytes)
    return len(payload).to_bytes(HEADER_BYTES, "big") + payload


def encode_frames(messages: Sequence[Message], *, max_frame_bytes: int = MAX_FRAME_BYTES) -> bytes:
    """Several frames back to back, ready for one write."""
    return b"".join(encode_frame(m, max_frame_bytes=max_frame_bytes) for m in messages)


def decode_payload(payload: bytes | bytearray) -> Message:
    """The message in one frame payload; `WireError` if it is not one."""
    try:
        mapping = msgpack.unpackb(payload)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise MalformedFrame(reason=f"payload is not valid msgpack ({exc})") from exc
    if not isinstance(mapping, dict):
        raise MalformedFrame(reason=f"payload is a {type(mapping).__name__}, not a map")
    tag = mapping.pop(TYPE_KEY, None)
    if tag is None:
        raise MalformedFrame(reason=f"map has no {TYPE_KEY!r} key")
    message_type = _TYPE_BY_TAG.get(tag) if isinstance(tag, str) else None
    if message_type is None:
        raise UnknownMessageType(type_tag=tag, known=_KNOWN_TAGS)
    try:
        message: Message = _STRUCTURE[message_type](mapping, message_type)
    except cattrs.BaseValidationError as exc:
        reasons = cattrs.transform_error(exc, format_exception=_reason)
        raise MalformedFrame(reason="; ".join(reasons), message_type=tag) from exc
    except Exception as exc:
        # Constructors validate (Misuse) and cattrs may raise plain
        # errors on shapes it cannot walk; whatever it is, the frame is bad,
        # and bad input must reach the reader as a WireError, never a crash.
        raise MalformedFrame(reason=str(exc) or type(exc).__name__, message_type=tag) from exc
    return message


class FrameDecoder:
    """Streaming frame decoder: `feed` bytes as they arrive, iterate complete messages.

    Iteration stops when no complete frame is buffered. A malformed frame raises
    `MalformedFrame` / `UnknownMessageType` after it is consumed, so the caller
    may log it and keep iterating. An oversized length header raises
    `FrameTooLarge` and is fatal: the stream cannot be resynchronised, and every
    later iteration raises the same error.
    """

    def __init__(self, *, max_frame_bytes: int = MAX_FRAME_BYTES) -> None:
        self.max_frame_bytes = max_frame_bytes
        self._buffer = bytearray()
        self._offset = 0
        self._fatal: FrameTooLarge | None = None

    def feed(self, data: bytes | bytearray) -> None:
        if self._offset:
            del self._buffer[: self._offset]
            self._offset = 0
        self._buffer += data

    @property
    def buffered_bytes(self) -> int:
        """Bytes received but not yet part of a returned message."""
        return len(self._buffer) - self._offset

    def __iter__(self) -> Iterator[Message]:
        return self

    def __next__(self) -> Message:
        if self._fatal is not None:
            raise self._fatal
        buffer, start = self._buffer, self._offset
        if len(buffer) - start < HEADER_BYTES:
            raise StopIteration
        size = int.from_bytes(buffer[start : start + HEADER_BYTES], "big")
        if size > self.max_frame_bytes:
            self._fatal = FrameTooLarge(frame_bytes=size, max_frame_bytes=self.max_frame_bytes)
            raise self._fatal
        end = start + HEADER_BYTES + size
        if len(buffer) < end:
            raise StopIteration
        self._offset = end
        return decode_payload(buffer[start + HEADER_BYTES : end])
