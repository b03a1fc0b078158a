"""The `call_list` builder: the task's payload spells out every call.

Payload: `{"calls": [{"function": "demo.add", "args": [1, 2], "id": "a"}, ...]}`
or the bare array. A call's id is its `id`, else its index. Never guesses: an
entry that is not exactly a call fails the whole task, naming the entry.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

import msgpack  # type: ignore[import-untyped]  # ships no type information

from blockx.calls import CallSpec
from blockx.errors import shown
from blockx.phases.builders._json import (
    argument_list,
    check_keys,
    encoded_args,
    function_ref,
    json_type,
    parse_config,
    parse_json,
)
from blockx.phases.builders._model import BuilderFailed, BuildRequest

NAME: Final = "call_list"
CALL_KEYS: Final = ("function", "args", "id")
SHAPE: Final = '{"calls": [{"function": ..., "args": [...], "id": ...}, ...]} or an array of calls'


def _entries(document: object) -> list[object]:
    if isinstance(document, list):
        return document
    if not isinstance(document, dict):
        raise BuilderFailed(message=f"{NAME}: payload must be {SHAPE}, got {json_type(document)}")
    if "calls" not in document:
        raise BuilderFailed(message=f"{NAME}: payload has no 'calls' key; expected {SHAPE}")
    check_keys(NAME, "payload", document, ("calls",))
    calls = document["calls"]
    if not isinstance(calls, list):
        raise BuilderFailed(
            message=f"{NAME}: payload.calls must be an array, got {json_type(calls)}"
        )
    return calls


def call_list_calls(request: BuildRequest) -> list[CallSpec]:
    parse_config(NAME, request.function_call.config_json, ())
    if not request.payload.strip():
        raise BuilderFailed(message=f"{NAME}: payload is empty; expected {SHAPE}")
    entries = _entries(parse_json(NAME, "payload", request.payload))
    calls: list[CallSpec] = []
    seen: set[str] = set()
    functions = _CHECKED_FUNCTIONS
    if len(functions) > _MAX_CHECKED_FUNCTIONS:
        functions.clear()
    pack = msgpack.Packer().pack  # encode_args' own encoding, one packer for the task
    for index, entry in enumerate(entries):
        # The common case is checked without building messages; `_call` checks the rest
        # field by field, naming what is wrong.
        if (
            type(entry) is dict
            and entry.keys() <= _CALL_KEY_SET
            and type(function := entry.get("function")) is str
            and function in functions
            and type(args := entry.get("args", _NO_ARGS)) is list
            and type(call_id := entry.get("id", str(index))) is str
            and call_id
            and call_id not in seen
            and (encoded := _packed_or_none(pack, args)) is not None
        ):
            seen.add(call_id)
            calls.append(CallSpec(call_id=call_id, function=function, args=encoded))
            continue
        call = _call(index, entry, seen)
        functions.add(call.function)
        calls.append(call)
    return calls


_NO_ARGS: Final[list[object]] = []
_CHECKED_FUNCTIONS: Final[set[str]] = set()
"""Function references `_call` has found well formed, in every task: a task names few,
and a worker's tasks name the same ones, so a task of one call is checked quickly too."""
_MAX_CHECKED_FUNCTIONS: Final = 10_000


def _packed_or_none(pack: Callable[[object], bytes], args: list[object]) -> bytes | None:
    """`args` encoded as `encode_args` does, or None when they cannot be (`_call` then
    says why)."""
    try:
        return pack(args)
    except (TypeError, ValueError, OverflowError):
        return None


_CALL_KEY_SET: Final = frozenset(CALL_KEYS)


def _call(index: int, entry: object, seen: set[str]) -> CallSpec:
    """Entry `index` checked field by field, each refusal naming it."""
    where = f"calls[{index}]"
    if not isinstance(entry, dict):
        raise BuilderFailed(
            message=f"{NAME}: {where} must be an object with 'function' and optional "
            f"'args' and 'id', got {json_type(entry)}"
        )
    check_keys(NAME, where, entry, CALL_KEYS)
    function = function_ref(NAME, f"{where}.function", entry.get("function"))
    args = argument_list(NAME, f"{where}.args", entry.get("args", []))
    call_id = entry.get("id", str(index))
    if not isinstance(call_id, str) or not call_id:
        raise BuilderFailed(
            message=f"{NAME}: {where}.id must be a non-empty string, got {shown(call_id)}"
        )
    if call_id in seen:
        raise BuilderFailed(
            message=f"{NAME}: duplicate call id {call_id!r} at {where}; "
            "call ids must be unique (an entry without 'id' takes its index)"
        )
    seen.add(call_id)
    return CallSpec(
        call_id=call_id, function=function, args=encoded_args(NAME, f"{where}.args", args)
    )


class CallListBuilder:
    """Calls spelled out in the payload."""

    name: Final = NAME
    usage: Final = (
        'payload {"calls": [{"function": "module.fn", "args": [...], "id": "..."}, ...]} '
        "(args and id optional); no config"
    )

    async def build(self, request: BuildRequest) -> list[CallSpec]:
        return call_list_calls(request)

    def build_now(self, request: BuildRequest) -> list[CallSpec]:
        return call_list_calls(request)
