"""The hub protocol's codec: every message survives a round trip; anything else is a ProtocolError.

Decoding never raises anything but `ProtocolError`, whatever the bytes, and
never coerces: a string where an integer belongs is an error, not a number.
"""

from __future__ import annotations

import typing
from typing import Any

import attrs
import msgpack  # type: ignore[import-untyped]  # ships no type information
import pytest
from hypothesis import given
from hypothesis import strategies as st

from blockx.hubwire import (
    MAX_CAPACITY,
    MAX_FRAME_BYTES,
    MAX_FRAME_MESSAGES,
    MAX_ID_CHARS,
    MAX_INT,
    TAGS,
    AttemptRef,
    Capability,
    Failed,
    Finish,
    Heartbeat,
    Message,
    OpenSession,
    ProtocolError,
    ResumedAttempt,
    Succeeded,
    Unknown,
    decode,
    encode,
)

OUTCOME_CLASSES = (Succeeded, Failed, Unknown)
MESSAGE_CLASSES = [cls for cls in TAGS if cls not in OUTCOME_CLASSES]

ids = st.text(min_size=1, max_size=MAX_ID_CHARS)
wide_ints = st.integers(min_value=0, max_value=MAX_INT)
counts = st.integers(min_value=0, max_value=MAX_CAPACITY)
capabilities = st.builds(
    Capability, handler=st.text(), handler_version=st.text(), payload_version=st.text()
)
outcomes = st.one_of(
    st.builds(Succeeded, result=st.text()),
    st.builds(Failed, code=st.text(), details=st.text(), retryable=st.booleans()),
    st.builds(Unknown, code=st.text()),
)


def _for_field(name: str, hint: Any) -> st.SearchStrategy[Any]:
    if name == "capacity":
        return counts
    if name == "capabilities":
        return st.lists(capabilities, min_size=1, max_size=4).map(tuple)
    if name.endswith("_id"):
        return ids
    return _for_type(hint)


def _for_type(hint: Any) -> st.SearchStrategy[Any]:
    if hint is int:
        return wide_ints
    if hint is Capability:
        return capabilities
    if hint in (AttemptRef, ResumedAttempt):
        return _messages_of(hint)
    if typing.get_origin(hint) is tuple:
        return st.lists(_for_type(typing.get_args(hint)[0]), max_size=4).map(tuple)
    if typing.get_origin(hint) in (typing.Union, type(int | str)):
        return outcomes
    return st.from_type(hint)


def _messages_of(cls: type) -> st.SearchStrategy[Any]:
    hints = typing.get_type_hints(cls)
    fields = {field.name: _for_field(field.name, hints[field.name]) for field in attrs.fields(cls)}
    return st.builds(cls, **fields)


messages: st.SearchStrategy[Message] = st.one_of([_messages_of(cls) for cls in MESSAGE_CLASSES])


@given(messages)
def test_every_message_survives_a_round_trip(message: Message) -> None:
    assert decode(encode([message])) == [message]


@given(st.lists(messages, min_size=1, max_size=40))
def test_a_frame_of_many_messages_keeps_them_in_order(batch: list[Message]) -> None:
    assert decode(encode(batch)) == batch


def test_a_frame_holds_up_to_the_limit_of_messages() -> None:
    batch = [Heartbeat(capacity=n) for n in range(MAX_FRAME_MESSAGES)]
    assert decode(encode(batch)) == batch
    with pytest.raises(ProtocolError, match="1 to 1024 messages"):
        decode(msgpack.packb([{"type": "heartbeat", "capacity": 1}] * (MAX_FRAME_MESSAGES + 1)))


def decoded_or_reason(data: bytes) -> list[Message] | str:
    """The messages, or the ProtocolError's reason; any other exception fails the test."""
    try:
        return decode(data)
    except ProtocolError as error:
        return error.reason


@given(st.binary(max_size=256))
def test_any_bytes_decode_or_are_a_protocol_error(data: bytes) -> None:
    decoded = decoded_or_reason(data)
    if isinstance(decoded, list):
        assert all(type(message) in TAGS for message in decoded)
    else:
        assert decoded


scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.text(max_size=8)
    | st.binary(max_size=8)
)
wire_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=5)
    ),
    max_leaves=20,
)
FIELD_NAMES = ["message_id", "attempt_id", "epoch", "capacity", "outcome", "attempts", "code"]
maps_with_a_type = st.builds(
    lambda tag, fields: {**fields, "type": tag},
    st.sampled_from(sorted(TAGS.values())),
    st.dictionaries(st.sampled_from(FIELD_NAMES), wire_values, max_size=6),
)


@given(st.lists(maps_with_a_type | wire_values, min_size=1, max_size=3))
def test_any_msgpack_structure_decodes_or_is_a_protocol_error(items: list[object]) -> None:
    decoded = decoded_or_reason(msgpack.packb(items))
    if isinstance(decoded, list):
        assert len(decoded) == len(items)
    else:
        assert decoded


START = {"type": "start", "message_id": "m1", "attempt_id": "a1", "epoch": 1}


@pytest.mark.parametrize(
    ("items", "reason"),
    [
        ("text", "frames are binary"),
        (b"\xc1", "not msgpack"),
        ({"type": "start"}, "an array of 1 to 1024 messages, not dict"),
        ([], "an array of 1 to 1024 messages, not list"),
        ([START, 3], "message 1 is a int, not a map"),
        ([{"epoch": 1}], "message 0 has type None"),
        ([{"type": "succeeded", "result": "1"}], "message 0 has type 'succeeded'"),
        ([{**START, "epoch": "1"}], "start message 0: expected int, got str @ $.epoch"),
        ([{**START, "epoch": True}], "expected int, got bool"),
        ([{**START, "extra": 1}], "extra fields"),
        ([{k: v for k, v in START.items() if k != "attempt_id"}], "attempt_id"),
        ([{**START, "message_id": ""}], "message_id must have 1 to 128 characters"),
        ([{**START, "message_id": "x" * 129}], "message_id must have 1 to 128 characters"),
        ([{"type": "heartbeat", "capacity": -1}], "must be from 0 to"),
        ([{"type": "heartbeat", "capacity": 10_001}], "capacity must be at most 10000"),
        ([{**START, "epoch": 2**63}], f"must be from 0 to {MAX_INT}, not {2**63} @ $.epoch"),
        (
            [{"type": "resume", "message_id": "m", "attempts": [{"attempt_id": "a", "epoch": -1}]}],
            "not -1 @ $.attempts[0].epoch",
        ),
        ([{"type": "resume", "message_id": "m", "attempts": ["a"]}], "expected a map"),
        (
            [{"type": "finish", "message_id": "m", "attempt_id": "a", "epoch": 1,
              "outcome": {"type": "maybe", "code": "X"}}],
            "finish message 0",
        ),
        (
            [{"type": "refused", "reply_to": "m", "attempt_id": "a", "code": "SORRY",
              "message": ""}],
            "'SORRY' is none of UNKNOWN_ATTEMPT",
        ),
    ],
)  # fmt: skip
def test_malformed_frames_name_what_is_wrong(items: object, reason: str) -> None:
    frame = items if isinstance(items, str | bytes) else msgpack.packb(items)
    with pytest.raises(ProtocolError) as raised:
        decode(frame)
    assert reason in raised.value.reason


def test_a_session_needs_a_capability_and_frames_have_a_size_limit() -> None:
    session = OpenSession(
        message_id="m", instance_id="i", queue_id="q", capabilities=(), capacity=1
    )
    with pytest.raises(ProtocolError, match="at least one capability"):
        decode(encode([session]))
    with pytest.raises(ProtocolError, match=f"at most {MAX_FRAME_BYTES}"):
        decode(b"\x91" + b"\x00" * MAX_FRAME_BYTES)


def test_an_outcome_is_tagged_by_its_type() -> None:
    finish = Finish(message_id="m", attempt_id="a", epoch=2, outcome=Failed(code="X"))
    (item,) = msgpack.unpackb(encode([finish]))
    assert item == {
        "type": "finish",
        "message_id": "m",
        "attempt_id": "a",
        "epoch": 2,
        "outcome": {"type": "failed", "code": "X", "details": "{}", "retryable": False},
    }
