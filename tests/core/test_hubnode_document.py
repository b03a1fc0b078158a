"""The document a node reports for a hub attempt is the one `blockx submit --watch` prints.

`result_document` makes it with the C protobuf runtime; `readable` with betterproto2.
They must agree to the byte, for every kind of result.
"""

from __future__ import annotations

import json

import pytest

from blockx._proto.blockx.worker import v1 as pb
from blockx.api import result_message
from blockx.calls import CallStats, FailureCode
from blockx.client import readable
from blockx.hubnode._document import result_document
from blockx.slots import PhaseTimings, PluginResult, TaskPhase, TaskResult, TaskState


def kept(outputs_json: str) -> tuple[PluginResult, ...]:
    return (
        PluginResult(plugin_type="result", ok=True, records_written=1, outputs_json=outputs_json),
    )


RESULTS = {
    "succeeded with outputs": TaskResult(
        task_id="01a2#1",
        slot_id="slot-3",
        state=TaskState.SUCCEEDED,
        phase=TaskPhase.PLUGIN,
        output_count=1,
        output_bytes=1,
        plugin_results=kept("[3]"),
        call_stats=CallStats(calls_total=1, calls_succeeded=1),
        timings=PhaseTimings(calls_ms=4, plugin_ms=1, total_ms=5),
        task_code_epoch="f627c8e7",
        accepted_at_ms=1_796_471_112_217,
        finished_at_ms=1_796_471_112_222,
    ),
    "failed, retryable, text not ASCII": TaskResult(
        task_id="t#2",
        slot_id="slot-0",
        state=TaskState.FAILED,
        phase=TaskPhase.CALLS,
        failure_code=FailureCode.CALL_RAISED_RETRYABLE,
        message='déjà "vu" \u2603\n',
        retryable=True,
        call_stats=CallStats(calls_total=3, calls_failed=1, calls_retried=2),
    ),
    "nothing but its ids": TaskResult(
        task_id="t#3", slot_id="", state=TaskState.FAILED, phase=TaskPhase.PREPARING
    ),
    "plugins that kept nothing": TaskResult(
        task_id="t#4",
        slot_id="slot-1",
        state=TaskState.SUCCEEDED,
        phase=TaskPhase.PLUGIN,
        plugin_results=(
            PluginResult(plugin_type="jsonl", ok=True, records_written=2**40, detail="out.jsonl"),
            PluginResult(plugin_type="table_upserts", ok=False, detail="locked"),
        ),
    ),
    "outputs of values of every JSON kind": TaskResult(
        task_id="t#5",
        slot_id="slot-1",
        state=TaskState.SUCCEEDED,
        phase=TaskPhase.PLUGIN,
        plugin_results=kept('[1.5e300, 12345678901234567890, null, {"a": [true]}, "\\u00e9"]'),
    ),
    "outputs that are not JSON": TaskResult(
        task_id="t#6",
        slot_id="slot-1",
        state=TaskState.SUCCEEDED,
        phase=TaskPhase.PLUGIN,
        plugin_results=kept("[1,"),
    ),
    "outputs that are not an array": TaskResult(
        task_id="t#7",
        slot_id="slot-1",
        state=TaskState.SUCCEEDED,
        phase=TaskPhase.PLUGIN,
        plugin_results=kept('{"n": 1}'),
    ),
    "outputs nested too deeply": TaskResult(
        task_id="t#8",
        slot_id="slot-1",
        state=TaskState.SUCCEEDED,
        phase=TaskPhase.PLUGIN,
        plugin_results=kept("[" * 100_000 + "]" * 100_000),
    ),
}


@pytest.mark.parametrize("result", RESULTS.values(), ids=RESULTS.keys())
def test_the_document_is_the_readable_result(result: TaskResult) -> None:
    expected = json.dumps(
        readable(pb.TaskResult().parse(result_message(result).SerializeToString()))
    )
    assert result_document(result) == expected
