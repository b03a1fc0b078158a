"""Inline plugins: `run_now` stores as `run` does and declines what is too much for a step."""

from __future__ import annotations

import json

import pytest

from blockx.calls import encode_value
from blockx.phases.plugins import (
    INLINE_OUTPUTS_BYTES,
    InlinePlugin,
    LogPlugin,
    MemoryPlugin,
    PluginRequest,
    ResultPlugin,
)
from blockx.phases.plugins import test_outputs as stored_outputs
from blockx.slots import (
    ResultHandler,
)

VALUES = (3, "HI!", [1, {"k": None}], b"\x00\xff")
OUTPUTS = tuple(encode_value(value) for value in VALUES)


def plugin_request(
    kind: str, config: object = None, outputs: tuple[bytes, ...] = OUTPUTS
) -> PluginRequest:
    config_json = "" if config is None else json.dumps(config)
    return PluginRequest(
        task_id="t1",
        handler=ResultHandler(type=kind, config_json=config_json),
        outputs=outputs,
        task_code_epoch="e1",
    )


@pytest.mark.parametrize("plugin", [ResultPlugin(), MemoryPlugin(), LogPlugin()])
async def test_each_inline_plugin_stores_the_same_inline_as_in_a_task_actor(
    plugin: InlinePlugin,
) -> None:
    request = plugin_request(plugin.name)
    assert plugin.run_now(request) == await plugin.run(request)


def test_the_result_plugin_keeps_small_outputs_inline_and_declines_larger_ones() -> None:
    small = plugin_request("result", outputs=(encode_value("x" * (INLINE_OUTPUTS_BYTES - 3)),))
    assert len(small.outputs[0]) == INLINE_OUTPUTS_BYTES
    kept = ResultPlugin().run_now(small)
    assert kept is not None
    assert kept.outputs_json == json.dumps(["x" * (INLINE_OUTPUTS_BYTES - 3)])
    larger = plugin_request("result", outputs=(*small.outputs, encode_value(1)))
    assert ResultPlugin().run_now(larger) is None


async def test_outputs_the_result_plugin_declined_are_kept_by_its_run() -> None:
    larger = plugin_request("result", outputs=(encode_value("x" * INLINE_OUTPUTS_BYTES),))
    assert ResultPlugin().run_now(larger) is None
    kept = await ResultPlugin().run(larger)
    assert kept.outputs_json == json.dumps(["x" * INLINE_OUTPUTS_BYTES])


def test_the_test_plugin_declines_a_configured_delay_and_keeps_nothing() -> None:
    asked = plugin_request("test", {"delay_ms": 10})
    request = PluginRequest(
        task_id="never-stored-inline",  # the store is the module's: a name no other test uses
        handler=asked.handler,
        outputs=asked.outputs,
        task_code_epoch="e1",
    )
    assert MemoryPlugin().run_now(request) is None
    assert stored_outputs("never-stored-inline") is None
