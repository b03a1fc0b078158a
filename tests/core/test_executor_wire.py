"""The executor wire format: every message round-trips, bad input is a WireError."""

from __future__ import annotations

import math
from typing import Any

import attrs
import msgpack  # type: ignore[import-untyped]  # ships no type information
import pytest
from hypothesis import given
from hypothesis import strategies as st

from blockx.calls import (
    CallOutcome,
    FailureCode,
    InvalidArguments,
    decode_args,
    decode_value,
    encode_args,
    encode_value,
)
from blockx.errors import Misuse
from blockx.executors import (
    MAX_FRAME_BYTES,
    PROTOCOL_VERSION,
    CallRequest,
    CallResults,
    CancelCall,
    CodeReply,
    CodeRequest,
    FrameDecoder,
    FrameTooLarge,
    Heartbeat,
    Hello,
    MalformedFrame,
    Message,
    RevokeCall,
    RunCalls,
    Shutdown,
    Subcall,
    SubcallResult,
    UnknownMessageType,
    Welcome,
    WireError,
    decode_payload,
    encode_frame,
    encode_frames,
    encode_payload,
    encode_run_calls_frame,
)
from blockx.executors._wire import MESSAGE_TAGS

ids = st.text(max_size=24)
counts = st.integers(min_value=0, max_value=2**63 - 1)
blobs = st.binary(max_size=64)
maybe_text = st.none() | st.text(max_size=40)
error_codes = st.sampled_from(list(FailureCode))

call_requests = st.builds(
    CallRequest,
    call_id=ids,
    attempt=counts,
    task_id=ids,
    epoch=ids,
    function=ids,
    args=blobs,
    deadline_ms_from_now=st.none() | counts,
)

succeeded = st.builds(
    lambda i, attempt, v: CallOutcome.success(call_id=i, attempt=attempt, value=v),
    ids,
    counts,
    st.binary(min_size=1, max_size=64),  # a value is at least one msgpack byte
)
failed = st.builds(
    lambda i, attempt, code, message, retryable: CallOutcome.failure(
        call_id=i, attempt=attempt, error_code=code, error_message=message, retryable=retryable
    ),
    ids,
    counts,
    error_codes,
    st.text(max_size=40),
    st.booleans(),
)
outcomes: st.SearchStrategy[CallOutcome] = succeeded | failed

STRATEGIES: dict[type[Any], st.SearchStrategy[Any]] = {
    Hello: st.builds(Hello, executor_id=ids, pid=counts, token=ids, protocol_version=counts),
    Welcome: st.builds(Welcome, heartbeat_interval_ms=counts, max_result_bytes=counts),
    Heartbeat: st.builds(
        Heartbeat,
        running_call_id=st.none() | ids,
        loop_progress_age_ms=counts,
        rss_bytes=counts,
        calls_served=counts,
    ),
    RunCalls: st.builds(RunCalls, calls=st.lists(call_requests, max_size=5).map(tuple)),
    CallResults: st.builds(
        CallResults,
        results=st.lists(outcomes, max_size=5).map(tuple),
        succeeded=st.lists(
            st.tuples(ids, counts, st.binary(min_size=1, max_size=16)), max_size=5
        ).map(tuple),
    ),
    CancelCall: st.builds(CancelCall, call_id=ids, attempt=counts),
    RevokeCall: st.builds(RevokeCall, call_id=ids, attempt=counts),
    CodeRequest: st.builds(CodeRequest, request_id=ids, epoch=ids, module=ids),
    CodeReply: st.builds(CodeReply, request_id=ids, source=maybe_text, error=maybe_text),
    Subcall: st.builds(
        Subcall,
        subcall_id=ids,
        parent_call_id=ids,
        parent_attempt=counts,
        function=ids,
        args=blobs,
    ),
    SubcallResult: st.builds(SubcallResult, outcome=outcomes),
    Shutdown: st.just(Shutdown()),
}
messages: st.SearchStrategy[Message] = st.one_of(*STRATEGIES.values())


def decode_all(decoder: FrameDecoder) -> list[Message]:
    return list(decoder)


def frame_of(payload: bytes) -> bytes:
    return len(payload).to_bytes(4, "big") + payload


def test_every_message_type_has_a_strategy_and_a_tag() -> None:
    assert set(STRATEGIES) == set(MESSAGE_TAGS)
    assert len(set(MESSAGE_TAGS.values())) == len(MESSAGE_TAGS)


@given(messages)
def test_every_message_round_trips_through_a_frame(message: Message) -> None:
    decoder = FrameDecoder()
    decoder.feed(encode_frame(message))
    assert decode_all(decoder) == [message]
    assert decoder.buffered_bytes == 0


@given(st.lists(messages, max_size=6), st.data())
def test_a_stream_cut_anywhere_yields_the_same_messages(
    sent: list[Message], data: st.DataObject
) -> None:
    stream = encode_frames(sent)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=8)))
    decoder = FrameDecoder()
    received: list[Message] = []
    start = 0
    for end in [*cuts, len(stream)]:
        decoder.feed(stream[start:end])
        received.extend(decoder)
        start = end
    assert received == sent
    assert decoder.buffered_bytes == 0


@given(st.binary(max_size=300))
def test_arbitrary_bytes_give_messages_or_wire_errors_never_a_crash(garbage: bytes) -> None:
    decoder = FrameDecoder(max_frame_bytes=1024)
    decoder.feed(garbage)
    while True:
        try:
            next(decoder)
        except StopIteration:
            break
        except FrameTooLarge:
            break  # fatal by design
        except WireError:
            continue  # that frame is consumed; the next one may be fine


json_like = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.text(max_size=8) | blobs,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=8,
)


@given(st.data())
def test_any_map_with_a_known_tag_decodes_or_names_the_problem(data: st.DataObject) -> None:
    message_type = data.draw(st.sampled_from(list(MESSAGE_TAGS)))
    tag = MESSAGE_TAGS[message_type]
    names = [field.name for field in attrs.fields(message_type)]
    # Any subset of the real fields (and maybe a stray one), with values of any type.
    fields = data.draw(
        st.fixed_dictionaries({}, optional=dict.fromkeys([*names, "stray"], json_like))
    )
    try:
        decoded = decode_payload(msgpack.packb({**fields, "type": tag}))
    except MalformedFrame as error:
        caught = error
    else:
        assert type(decoded) is message_type
        return
    assert caught.message_type == tag
    assert caught.reason


def test_a_partial_frame_waits_for_the_rest() -> None:
    frame = encode_frame(CancelCall(call_id="c1", attempt=1))
    decoder = FrameDecoder()
    decoder.feed(frame[:2])
    assert decode_all(decoder) == []
    decoder.feed(frame[2:-1])
    assert decode_all(decoder) == []
    decoder.feed(frame[-1:])
    assert decode_all(decoder) == [CancelCall(call_id="c1", attempt=1)]


def test_an_oversized_length_is_fatal_and_names_both_sizes() -> None:
    decoder = FrameDecoder(max_frame_bytes=100)
    decoder.feed((101).to_bytes(4, "big") + b"x" * 101 + encode_frame(Shutdown()))
    for _ in range(2):  # the stream cannot be resynchronised: it stays broken
        with pytest.raises(FrameTooLarge) as caught:
            next(decoder)
        assert (caught.value.frame_bytes, caught.value.max_frame_bytes) == (101, 100)


def test_encoding_refuses_a_frame_the_peer_would_refuse() -> None:
    call = CallRequest(
        call_id="c", attempt=1, task_id="t", epoch="e", function="m.f", args=b"x" * 200
    )
    with pytest.raises(FrameTooLarge) as caught:
        encode_frame(RunCalls(calls=(call,)), max_frame_bytes=100)
    assert caught.value.max_frame_bytes == 100
    assert caught.value.frame_bytes > 200
    assert MAX_FRAME_BYTES == 64 * 1024 * 1024


def test_a_bad_frame_is_consumed_and_the_next_one_still_decodes() -> None:
    decoder = FrameDecoder()
    decoder.feed(frame_of(b"\xc1") + encode_frame(CancelCall(call_id="c2", attempt=1)))
    with pytest.raises(MalformedFrame, match="not valid msgpack"):
        next(decoder)
    assert decode_all(decoder) == [CancelCall(call_id="c2", attempt=1)]


@pytest.mark.parametrize(
    ("payload", "fragment"),
    [
        (b"", "not valid msgpack"),
        (b"\xc1", "not valid msgpack"),
        (msgpack.packb([1, 2]), "payload is a list, not a map"),
        (msgpack.packb({"call_id": "c"}), "map has no 'type' key"),
        (
            msgpack.packb({"type": "cancel_call", "call_id": 7, "attempt": 1}),
            "expected str, got int @ $.call_id",
        ),
        (
            msgpack.packb({"type": "cancel_call", "attempt": 1}),
            "required field missing @ $.call_id",
        ),
        (
            msgpack.packb({"type": "cancel_call", "call_id": "c"}),
            "required field missing @ $.attempt",
        ),
        (
            msgpack.packb({"type": "cancel_call", "call_id": "c", "attempt": True}),
            "expected int, got bool @ $.attempt",
        ),
        (
            msgpack.packb({"type": "cancel_call", "call_id": "c", "attempt": 1, "x": 1}),
            "extra fields found (x)",
        ),
        (
            msgpack.packb(
                {
                    "type": "hello",
                    "executor_id": "e",
                    "pid": True,
                    "token": "t",
                    "protocol_version": PROTOCOL_VERSION,
                }
            ),
            "expected int, got bool @ $.pid",
        ),
        (
            msgpack.packb(
                {
                    "type": "call_results",
                    "results": [
                        {"call_id": "c", "attempt": 1, "ok": True, "error_code": "CALL_RAISED"}
                    ],
                }
            ),
            "call outcome 'c': ok=True with error_code=<FailureCode.CALL_RAISED: 'CALL_RAISED'>",
        ),
        (
            msgpack.packb(
                {"type": "subcall_result", "outcome": {"call_id": "c", "attempt": 1, "ok": False}}
            ),
            "call outcome 'c': ok=False with error_code=None and 0 value bytes (a success has "
            "a value and no code, a failure a code and no value) @ $.outcome",
        ),
        (
            msgpack.packb(
                {
                    "type": "call_results",
                    "results": [{"call_id": "c", "attempt": 1, "ok": False, "error_code": "NOPE"}],
                }
            ),
            "error_code 'NOPE' is not a failure code @ $.results[0]",
        ),
        (
            msgpack.packb({"type": "call_results", "results": [{"call_id": "c", "ok": True}]}),
            "CallOutcome: keys ['call_id', 'ok'] do not match ['attempt', 'call_id', "
            "'error_code', 'error_message', 'ok', 'retryable', 'value'] @ $.results[0]",
        ),
        (
            msgpack.packb({"type": "run_calls", "calls": "none"}),
            "$.calls",
        ),
        (
            msgpack.packb({"type": "run_calls", "calls": [["c", 1, "t", "e", "m.f", b""]]}),
            "a call is an array of 7 fields @ $.calls[0]",
        ),
        (
            msgpack.packb(
                {"type": "run_calls", "calls": [["c", 1, "t", "e", "m.f", b"", None], ["c"] * 7]}
            ),
            "attempt: unexpected str @ $.calls[1]",
        ),
        (
            msgpack.packb({"type": "run_calls", "calls": [], "extra": 1}),
            "RunCalls: expected a map whose one key is calls",
        ),
        (
            msgpack.packb({"type": "call_results", "succeeded": ["c", 1]}),
            "CallResults.succeeded: expected an array of (call id, attempt, value)",
        ),
        (
            msgpack.packb({"type": "call_results", "succeeded": ["c", 1, b"v", "d", "2", b"v"]}),
            "a success is (string, integer, non-empty bytes), got ['str', 'str', 'bytes'] "
            "@ $.succeeded[3]",
        ),
        (
            msgpack.packb({"type": "call_results", "succeeded": ["c", 1, b""]}),
            "got ['str', 'int', 'empty bytes'] @ $.succeeded[0]",
        ),
        (
            msgpack.packb({"type": "call_results", "results": {}, "succeeded": []}),
            "CallResults.results: expected an array, got dict",
        ),
        (
            msgpack.packb({"type": "call_results", "outcomes": []}),
            "keys ['outcomes'] are not results and succeeded",
        ),
    ],
)
def test_malformed_payloads_name_what_is_wrong(payload: bytes, fragment: str) -> None:
    with pytest.raises(MalformedFrame) as caught:
        decode_payload(payload)
    assert fragment in str(caught.value)


def test_an_unknown_type_tag_lists_the_known_ones() -> None:
    with pytest.raises(UnknownMessageType) as caught:
        decode_payload(msgpack.packb({"type": "reboot"}))
    assert caught.value.type_tag == "reboot"
    assert "hello" in caught.value.known
    assert "run_calls" in str(caught.value)


def test_the_payload_is_a_map_with_the_type_tag() -> None:
    payload = encode_payload(CancelCall(call_id="c9", attempt=2))
    assert msgpack.unpackb(payload) == {"type": "cancel_call", "call_id": "c9", "attempt": 2}


def test_an_outcome_refuses_contradicting_fields() -> None:
    with pytest.raises(Misuse, match=r"ok=True with error_code=.*CALL_RAISED.* and 1 value bytes"):
        CallOutcome(
            call_id="x", attempt=1, ok=True, value=b"\x01", error_code=FailureCode.CALL_RAISED
        )
    with pytest.raises(Misuse, match="ok=True with error_code=None and 0 value bytes"):
        CallOutcome(call_id="x", attempt=1, ok=True)
    with pytest.raises(Misuse, match="ok=False with error_code=None and 0 value bytes"):
        CallOutcome(call_id="x", attempt=1, ok=False)
    with pytest.raises(Misuse, match=r"ok=False with error_code=.*CALL_RAISED.* and 1 value bytes"):
        CallOutcome(
            call_id="x",
            attempt=1,
            ok=False,
            value=b"\x01",
            error_code=FailureCode.CALL_RAISED,
            error_message="boom",
        )


def test_result_constructors() -> None:
    assert CallOutcome.success(call_id="a", attempt=2, value=b"\x01") == CallOutcome(
        call_id="a", attempt=2, ok=True, value=b"\x01"
    )
    failure = CallOutcome.failure(
        call_id="a",
        attempt=2,
        error_code=FailureCode.CALL_RAISED,
        error_message="boom",
        retryable=False,
    )
    assert (failure.ok, failure.error_code, failure.value) == (False, "CALL_RAISED", b"")
    assert (failure.call_id, failure.attempt, failure.error_message) == ("a", 2, "boom")


# --- call arguments and values -------------------------------------------------------

values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=10)
    | blobs,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner),
    max_leaves=6,
)
keywords = st.dictionaries(st.text(max_size=6).filter(lambda k: k != "*"), values, max_size=3)


@given(st.lists(values, max_size=3), keywords)
def test_arguments_round_trip(args: list[Any], kwargs: dict[str, Any]) -> None:
    assert decode_args(encode_args(args, kwargs)) == (args, kwargs)


def test_arguments_use_a_list_a_map_or_both() -> None:
    assert msgpack.unpackb(encode_args([1, 2])) == [1, 2]
    assert msgpack.unpackb(encode_args((), {"x": 1})) == {"x": 1}
    assert msgpack.unpackb(encode_args([1], {"x": 2})) == {"*": [1], "x": 2}
    assert decode_args(msgpack.packb({"x": 1})) == ([], {"x": 1})


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        (b"\xc1", "not valid msgpack"),
        (msgpack.packb(5), "a int, not a list or a map"),
        (msgpack.packb({"*": 3}), "'*' holds a int, not a list"),
        (msgpack.packb({1: 2}), "keyword 1 is not a string"),
    ],
)
def test_malformed_arguments_say_why(data: bytes, fragment: str) -> None:
    with pytest.raises(InvalidArguments) as caught:
        decode_args(data)
    assert fragment in caught.value.reason


@given(values)
def test_values_round_trip(value: Any) -> None:
    decoded = decode_value(encode_value(value))
    assert decoded == value or (isinstance(value, float) and math.isnan(value))


def test_values_without_a_msgpack_form_raise() -> None:
    with pytest.raises(TypeError):
        encode_value(object())
    with pytest.raises(OverflowError):
        encode_value(2**64)


@given(st.lists(call_requests, max_size=8))
def test_the_run_calls_fast_path_is_byte_identical_to_the_generic_encoder(
    requests: list[CallRequest],
) -> None:
    generic = encode_frame(RunCalls(calls=tuple(requests)))
    fast = encode_run_calls_frame(
        (r.call_id, r.attempt, r.task_id, r.epoch, r.function, r.args, r.deadline_ms_from_now)
        for r in requests
    )
    assert fast == generic


def test_the_run_calls_fast_path_refuses_an_oversized_frame() -> None:
    call = ("c", 1, "t", "e", "m.f", b"x" * 100, None)
    with pytest.raises(FrameTooLarge) as exc:
        encode_run_calls_frame([call], max_frame_bytes=64)
    assert exc.value.max_frame_bytes == 64
