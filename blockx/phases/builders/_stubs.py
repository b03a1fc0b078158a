"""Development stubs: the `static` and `payload` builders.

`static` makes `count` identical calls from its config alone; `payload` makes
one call per element of a JSON array payload (or one call for any other JSON
value). They exist to drive a worker by hand and in tests; neither reads
anything but the request.
"""

from __future__ import annotations

from typing import Final

from blockx.calls import CallSpec
from blockx.phases._config import config_integer
from blockx.phases.builders._json import (
    argument_list,
    encoded_args,
    function_ref,
    parse_config,
    parse_json,
)
from blockx.phases.builders._model import BuilderFailed, BuildRequest

STATIC: Final = "static"
PAYLOAD: Final = "payload"
MAX_STATIC_CALLS: Final = 100_000


def static_calls(request: BuildRequest) -> list[CallSpec]:
    config = parse_config(STATIC, request.function_call.config_json, ("function", "count", "args"))
    function = function_ref(STATIC, "config_json.function", config.get("function"))
    count = config_integer(STATIC, config, "count", (1, 0, MAX_STATIC_CALLS), BuilderFailed)
    args = argument_list(STATIC, "config_json.args", config.get("args", []))
    encoded = encoded_args(STATIC, "config_json.args", args)
    return [CallSpec(call_id=str(index), function=function, args=encoded) for index in range(count)]


def payload_calls(request: BuildRequest) -> list[CallSpec]:
    config = parse_config(PAYLOAD, request.function_call.config_json, ("function",))
    function = function_ref(PAYLOAD, "config_json.function", config.get("function"))
    if not request.payload.strip():
        return []
    document = parse_json(PAYLOAD, "payload", request.payload)
    elements = document if isinstance(document, list) else [document]
    return [
        CallSpec(
            call_id=str(index),
            function=function,
            args=encoded_args(PAYLOAD, f"payload[{index}]", [element]),
        )
        for index, element in enumerate(elements)
    ]


class StaticBuilder:
    """`count` identical calls of `function` with `args` (development stub)."""

    name: Final = STATIC
    usage: Final = (
        'config {"function": "module.fn", "args": [...], "count": N} (args default [], '
        "count default 1): N identical calls; no payload"
    )

    async def build(self, request: BuildRequest) -> list[CallSpec]:
        return static_calls(request)

    def build_now(self, request: BuildRequest) -> list[CallSpec]:
        return static_calls(request)


class PayloadBuilder:
    """One call of `function` per element of the payload's JSON array (development stub)."""

    name: Final = PAYLOAD
    usage: Final = (
        'config {"function": "module.fn"}; payload a JSON array: one call per element, '
        "with the element as its argument (any other JSON value: one call)"
    )

    async def build(self, request: BuildRequest) -> list[CallSpec]:
        return payload_calls(request)

    def build_now(self, request: BuildRequest) -> list[CallSpec]:
        return payload_calls(request)
