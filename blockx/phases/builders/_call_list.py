"""The `call_list` builder: the task's payload spells out every call.

Payload: `{"calls": [{"function": "demo.add", "args": [1, 2], "id": "a"}, ...]}`
or the bare array. A call's id is its `id`, else its index. Never guesses: an
entry that is not exactly a call fails the whole task, naming the entry.
"""

from __future__ import annotations

from typing import Final

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
    for index, entry in enumerate(entries):
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
        calls.append(
            CallSpec(
                call_id=call_id,
                function=function,
                args=encoded_args(NAME, f"{where}.args", args),
            )
        )
    return calls


class CallListBuilder:
    """Calls spelled out in the payload."""

    name: Final = NAME
    usage: Final = (
        'payload {"calls": [{"function": "module.fn", "args": [...], "id": "..."}, ...]} '
        "(args and id optional); no config"
    )

    async def build(self, request: BuildRequest) -> list[CallSpec]:
        return call_list_calls(request)
