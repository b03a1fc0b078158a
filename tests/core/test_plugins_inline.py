"""Inline plugins: `run_now` stores as `run` does, declines what is too much for a step, and
`store_inline` turns what it did into the plugin phase's outcome."""

from __future__ import annotations

import json

import pytest

from blockx.actors._task import store_inline
from blockx.calls import FailureCode, RetryPolicy, encode_value
from blockx.observability.logs import TaskContextFilter
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
    FunctionCall,
    PhaseOutcome,
    PluginResult,
    PrepareTaskActivation,
    ResultHandler,
    TaskPhase,
    TaskSpec,
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


def activation(kind: str, config: object = None) -> PrepareTaskActivation:
    config_json = "" if config is None else json.dumps(config)
    spec = TaskSpec(
        task_id="t1",
        function_call=FunctionCall(type="call_list"),
        result_handler=ResultHandler(type=kind, config_json=config_json),
    )
    return PrepareTaskActivation(
        task_id="t1",
        slot_id="slot-0",
        spec=spec,
        retry_policy=RetryPolicy(max_attempts=1, base_backoff_ms=0, jitter_percent=0),
        deadline_ms=0,
        stimulus_id="s",
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


def test_an_inline_store_reports_the_plugins_result_as_the_plugin_phase_outcome() -> None:
    outcome = store_inline(ResultPlugin().run_now, activation("result"), "e1", OUTPUTS[:2])
    assert outcome == PhaseOutcome(
        ok=True,
        plugin_results=(
            PluginResult(
                plugin_type="result", ok=True, records_written=2, outputs_json='[3,"HI!"]'
            ),
        ),
    )


def test_an_inline_store_declined_has_no_outcome() -> None:
    command = activation("test", {"delay_ms": 10})
    assert store_inline(MemoryPlugin().run_now, command, "e1", OUTPUTS) is None


def test_an_inline_plugin_refusing_fails_its_phase_with_plugin_failed() -> None:
    command = activation("test", {"fail": True, "message": "disk full", "retryable": True})
    outcome = store_inline(MemoryPlugin().run_now, command, "e1", OUTPUTS)
    assert outcome == PhaseOutcome(
        ok=False, failure_code=FailureCode.PLUGIN_FAILED, message="disk full", retryable=True
    )


def test_outputs_over_the_result_limit_fail_the_inline_phase_as_too_large() -> None:
    command = activation("result", {"max_bytes": 4})
    outcome = store_inline(ResultPlugin().run_now, command, "e1", OUTPUTS[:2])
    assert outcome is not None
    assert (outcome.ok, outcome.failure_code) == (False, FailureCode.OUTPUTS_TOO_LARGE)


def test_an_inline_plugin_that_raises_fails_its_phase_and_logs_the_task(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def broken(request: PluginRequest) -> PluginResult | None:
        raise RuntimeError(f"cannot store {request.task_id}")

    outcome = store_inline(broken, activation("result"), "e1", OUTPUTS)
    assert outcome == PhaseOutcome(
        ok=False, message="plugin raised RuntimeError('cannot store t1')"
    )
    [record] = caplog.records
    assert record.getMessage() == "task t1: PLUGIN phase raised"
    fields = vars(record)
    task_fields = (fields["task_id"], fields["slot_id"], fields["phase"], fields["task_code_epoch"])
    assert task_fields == ("t1", "slot-0", TaskPhase.PLUGIN.value, "e1")
    assert record.exc_info is not None


def test_what_an_inline_plugin_logs_carries_the_tasks_fields(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level("INFO", logger="blockx.plugins.log")
    caplog.handler.addFilter(TaskContextFilter())  # as the worker's handler has it
    outcome = store_inline(LogPlugin().run_now, activation("log"), "e1", OUTPUTS[:1])
    assert outcome is not None
    assert outcome.ok
    [record] = caplog.records
    assert record.getMessage() == "task t1: 1 outputs, 1 bytes: [3]"
    assert (getattr(record, "task_id", None), getattr(record, "phase", None)) == (
        "t1",
        TaskPhase.PLUGIN.value,
    )
