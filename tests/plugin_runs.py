"""Running a writer plugin on values, or a streaming builder on its config, outside a worker."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from blockx.calls import CallSpec, encode_value
from blockx.io import IOSystem
from blockx.phases.builders import BuildRequest, StreamingBuilder
from blockx.phases.plugins import Plugin, PluginRequest
from blockx.slots import FunctionCall, PluginResult, ResultHandler

LIMITS = {"sqlite": 4, "duckdb": 1, "postgres": 1}


async def run_plugin(
    plugin: Plugin, config: Mapping[str, Any], values: Sequence[object], task_id: str = "t1"
) -> PluginResult:
    """`plugin` on `values`, with `config` as its result handler's config, in an IO scope of
    its own (closed afterwards)."""
    scope = IOSystem(LIMITS).open_scope(task_id)
    request = PluginRequest(
        task_id=task_id,
        handler=ResultHandler(type=plugin.name, config_json=json.dumps(config)),
        outputs=tuple(encode_value(value) for value in values),
        task_code_epoch="e1",
        io=scope,
    )
    try:
        return await plugin.run(request)
    finally:
        await scope.aclose()


async def run_stream(
    builder: StreamingBuilder, config: Mapping[str, Any], payload: bytes = b""
) -> list[list[CallSpec]]:
    """`builder`'s batches for a task with `config` as its function-call config, in an IO
    scope of its own (closed afterwards)."""
    scope = IOSystem(LIMITS).open_scope("t1")
    request = BuildRequest(
        task_id="t1",
        function_call=FunctionCall(type=builder.name, config_json=json.dumps(config)),
        payload=payload,
        task_code_epoch="e1",
        io=scope,
    )
    try:
        return [list(batch) async for batch in builder.stream(request)]
    finally:
        await scope.aclose()
