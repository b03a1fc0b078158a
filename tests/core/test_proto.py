"""Round trips of the generated betterproto2 messages of blockx.worker.v1.

These pin down the behaviours the API layer relies on: exact round trips,
field presence of sub-messages (unset is `None`, set-but-empty survives), and
unknown enum values from newer peers surviving a round trip. The last tests
pin how the worker's replies, encoded by the protobuf runtime from domain
values, read back as the API's betterproto2 messages.
"""

import attrs
from hypothesis import given
from hypothesis import strategies as st

from blockx import slots
from blockx._proto.blockx.worker.v1 import (
    CallFailurePolicy,
    CallRetryPolicy,
    CallStatistics,
    ExecuteResult,
    FunctionCallConfig,
    GetTaskResultResponse,
    PhaseTimings,
    PluginResult,
    ResultHandler,
    RunTasksEvent,
    RunTasksResponse,
    SubmitTaskResponse,
    TaskPhase,
    TaskRefusal,
    TaskResult,
    TaskSpec,
    TaskState,
    TaskUpdate,
)
from blockx.actors import Accepted, Finished, Refused
from blockx.api._convert import result_response, stream_responses, submit_response, task_update
from blockx.calls import CallStats, FailureCode

UINT32 = st.integers(min_value=0, max_value=2**32 - 1)
UINT64 = st.integers(min_value=0, max_value=2**64 - 1)
INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)

function_calls = st.builds(FunctionCallConfig, type=st.text(), config_json=st.text())
result_handlers = st.builds(ResultHandler, type=st.text(), config_json=st.text())
retry_policies = st.builds(
    CallRetryPolicy, max_attempts=UINT32, base_backoff_ms=UINT32, jitter_percent=UINT32
)
task_specs = st.builds(
    TaskSpec,
    task_id=st.text(),
    function_call=st.none() | function_calls,
    payload=st.binary(),
    result_handler=st.none() | result_handlers,
    task_timeout_ms=INT64,
    call_failure_policy=st.sampled_from(CallFailurePolicy),
    call_retry_policy=st.none() | retry_policies,
    labels=st.dictionaries(st.text(), st.text()),
)

plugin_results = st.builds(
    PluginResult, plugin_type=st.text(), ok=st.booleans(), records_written=UINT64, detail=st.text()
)
execute_results = st.builds(
    ExecuteResult,
    output_count=UINT64,
    output_bytes=UINT64,
    plugin_results=st.lists(plugin_results, max_size=3),
)
phase_timings = st.builds(
    PhaseTimings,
    preparing_ms=INT64,
    builder_ms=INT64,
    calls_ms=INT64,
    plugin_ms=INT64,
    total_ms=INT64,
)
call_statistics = st.builds(
    CallStatistics,
    calls_total=UINT64,
    calls_succeeded=UINT64,
    calls_failed=UINT64,
    calls_retried=UINT64,
)
task_results = st.builds(
    TaskResult,
    task_id=st.text(),
    state=st.sampled_from(TaskState),
    phase=st.sampled_from(TaskPhase),
    failure_code=st.text(),
    message=st.text(),
    retryable=st.booleans(),
    execute_result=st.none() | execute_results,
    timings=st.none() | phase_timings,
    call_stats=st.none() | call_statistics,
    task_code_epoch=st.text(),
    accepted_at_ms=INT64,
    finished_at_ms=INT64,
    outputs_json=st.text(),
)
task_updates = st.builds(
    TaskUpdate,
    task_id=st.text(),
    state=st.sampled_from(TaskState),
    phase=st.sampled_from(TaskPhase),
    is_terminal=st.booleans(),
    result=task_results,
)


def test_full_task_spec_round_trips_exactly() -> None:
    spec = TaskSpec(
        task_id="task-0001",
        function_call=FunctionCallConfig(type="python.map", config_json='{"fn": "double"}'),
        payload=b"\x00\x01payload\xff",
        result_handler=ResultHandler(type="file", config_json='{"path": "/tmp/out"}'),
        task_timeout_ms=30_000,
        call_failure_policy=CallFailurePolicy.BEST_EFFORT,
        call_retry_policy=CallRetryPolicy(max_attempts=3, base_backoff_ms=200, jitter_percent=5),
        labels={"tenant": "acme", "priority": "high"},
    )

    parsed = TaskSpec.parse(bytes(spec))

    assert parsed == spec
    assert parsed.labels == {"tenant": "acme", "priority": "high"}
    assert parsed.result_handler == ResultHandler(type="file", config_json='{"path": "/tmp/out"}')
    assert parsed.call_retry_policy == CallRetryPolicy(
        max_attempts=3, base_backoff_ms=200, jitter_percent=5
    )
    assert parsed.call_failure_policy is CallFailurePolicy.BEST_EFFORT


@given(task_specs)
def test_task_spec_round_trips(spec: TaskSpec) -> None:
    encoded = bytes(spec)
    parsed = TaskSpec.parse(encoded)

    assert parsed == spec
    assert bytes(parsed) == encoded


@given(task_updates)
def test_task_update_with_result_round_trips(update: TaskUpdate) -> None:
    encoded = bytes(update)
    parsed = TaskUpdate.parse(encoded)

    assert parsed == update
    assert parsed.result == update.result
    assert bytes(parsed) == encoded


def test_terminal_task_update_carries_its_result() -> None:
    result = TaskResult(
        task_id="task-0001",
        state=TaskState.FAILED,
        phase=TaskPhase.CALLS,
        failure_code="TIMED_OUT",
        message="task deadline of 30000 ms passed",
        retryable=True,
        timings=PhaseTimings(preparing_ms=1, builder_ms=2, calls_ms=30_000, total_ms=30_003),
        call_stats=CallStatistics(calls_total=10, calls_succeeded=7, calls_retried=4),
        task_code_epoch="epoch-7",
        accepted_at_ms=1_700_000_000_000,
        finished_at_ms=1_700_000_030_003,
    )
    update = TaskUpdate(
        task_id="task-0001",
        state=TaskState.FAILED,
        phase=TaskPhase.TERMINAL,
        is_terminal=True,
        result=result,
    )

    parsed = TaskUpdate.parse(bytes(update))

    assert parsed == update
    assert parsed.result == result
    assert parsed.result is not None
    assert parsed.result.execute_result is None


def test_unset_result_handler_stays_unset() -> None:
    spec = TaskSpec(task_id="task-0001", payload=b"x")
    assert spec.result_handler is None

    parsed = TaskSpec.parse(bytes(spec))

    assert parsed.result_handler is None
    assert not parsed.is_set("result_handler")
    assert parsed.call_retry_policy is None


def test_empty_result_handler_stays_set() -> None:
    # An empty sub-message is still present on the wire. It is falsy, so code
    # must test presence with `is not None`, never with truthiness.
    spec = TaskSpec(task_id="task-0001", result_handler=ResultHandler())

    parsed = TaskSpec.parse(bytes(spec))

    assert parsed.result_handler is not None
    assert parsed.result_handler == ResultHandler()
    assert not parsed.result_handler


def test_enum_members_drop_the_proto_prefix() -> None:
    assert TaskState.RUNNING.proto_name == "TASK_STATE_RUNNING"
    assert TaskPhase.TERMINAL.proto_name == "TASK_PHASE_TERMINAL"
    assert CallFailurePolicy(0) is CallFailurePolicy.UNSPECIFIED


def test_unknown_enum_value_from_a_newer_peer_survives_a_round_trip() -> None:
    update = TaskUpdate(task_id="task-0001", state=TaskState(99))

    parsed = TaskUpdate.parse(bytes(update))

    assert parsed.state == 99
    assert parsed.state not in set(TaskState)
    assert bytes(parsed) == bytes(update)


def domain_result(failure_code: FailureCode | None, state: slots.TaskState) -> slots.TaskResult:
    return slots.TaskResult(
        task_id="task-0001",
        slot_id="slot-0",
        state=state,
        phase=slots.TaskPhase.TERMINAL,
        failure_code=failure_code,
        output_count=2,
        output_bytes=6,
        call_stats=CallStats(calls_total=2, calls_succeeded=2),
        timings=slots.PhaseTimings(
            preparing_ms=1, builder_ms=2, calls_ms=3, plugin_ms=4, total_ms=10
        ),
        task_code_epoch="epoch-7",
        accepted_at_ms=1_000,
        finished_at_ms=1_010,
    )


def expected_pb(failure_code: str, state: TaskState) -> TaskResult:
    return TaskResult(
        task_id="task-0001",
        state=state,
        phase=TaskPhase.TERMINAL,
        failure_code=failure_code,
        message="",
        retryable=False,
        execute_result=ExecuteResult(output_count=2, output_bytes=6, plugin_results=[]),
        timings=PhaseTimings(preparing_ms=1, builder_ms=2, calls_ms=3, plugin_ms=4, total_ms=10),
        call_stats=CallStatistics(calls_total=2, calls_succeeded=2),
        task_code_epoch="epoch-7",
        accepted_at_ms=1_000,
        finished_at_ms=1_010,
    )


def result_reply(result: slots.TaskResult) -> bytes:
    """The worker's GetTaskResult reply about `result`, as bytes."""
    return result_response(slots.TaskSnapshot.of_result(result)).data


def result_to_pb(result: slots.TaskResult) -> TaskResult:
    converted = GetTaskResultResponse.parse(result_reply(result)).result
    assert converted is not None
    return converted


def test_a_successful_result_has_an_empty_failure_code_on_the_wire() -> None:
    result = domain_result(None, slots.TaskState.SUCCEEDED)
    assert result_to_pb(result) == expected_pb("", TaskState.SUCCEEDED)
    reply = result_reply(result)
    assert bytes(GetTaskResultResponse.parse(reply)) == reply  # byte for byte


def test_a_failed_result_carries_its_failure_code_by_name() -> None:
    result = domain_result(FailureCode.CALL_RAISED, slots.TaskState.FAILED)
    converted = result_to_pb(result)
    assert converted == expected_pb("CALL_RAISED", TaskState.FAILED)
    assert converted.to_dict()["failureCode"] == "CALL_RAISED"


def test_outputs_a_plugin_kept_travel_once_in_the_result_not_in_its_plugin_result() -> None:
    kept = slots.PluginResult(
        plugin_type="result", ok=True, records_written=2, outputs_json='[3,"HI!"]'
    )
    result = attrs.evolve(domain_result(None, slots.TaskState.SUCCEEDED), plugin_results=(kept,))

    converted = TaskResult.parse(bytes(result_to_pb(result)))

    assert converted.outputs_json == '[3,"HI!"]'
    assert converted.execute_result is not None
    assert converted.execute_result.plugin_results == [
        PluginResult(plugin_type="result", ok=True, records_written=2, detail="")
    ]


def test_a_result_whose_plugin_kept_no_outputs_has_none_on_the_wire() -> None:
    stored = slots.PluginResult(plugin_type="jsonl", ok=True, records_written=2)
    result = attrs.evolve(domain_result(None, slots.TaskState.SUCCEEDED), plugin_results=(stored,))
    assert result.outputs_json == ""
    assert result_to_pb(result).outputs_json == ""


def test_each_reply_about_a_task_reads_back_with_its_snapshot_and_result() -> None:
    result = domain_result(FailureCode.TIMED_OUT, slots.TaskState.FAILED)
    snapshot = slots.TaskSnapshot.of_result(result)
    expected = expected_pb("TIMED_OUT", TaskState.FAILED)

    update = TaskUpdate.parse(task_update(snapshot).data)
    assert update == TaskUpdate(
        task_id="task-0001",
        state=TaskState.FAILED,
        phase=TaskPhase.TERMINAL,
        is_terminal=True,
        result=expected,
    )
    submitted = SubmitTaskResponse.parse(submit_response(snapshot).data)
    assert (submitted.slot_id, submitted.result) == ("slot-0", expected)

    refused = slots.NoSlot(task_id="t", task_slots=4)
    (encoded,) = stream_responses([Accepted(snapshot), Refused("t", refused), Finished(snapshot)])
    streamed = RunTasksResponse.parse(encoded.data)
    assert streamed.events == [
        RunTasksEvent(accepted=submitted),
        RunTasksEvent(refused=TaskRefusal(task_id="t", status=8, message=str(refused))),
        RunTasksEvent(finished=update),
    ]


def test_a_stream_response_holds_events_up_to_its_size_limit() -> None:
    kept = slots.PluginResult(
        plugin_type="result", ok=True, records_written=1, outputs_json="x" * 400_000
    )
    result = attrs.evolve(domain_result(None, slots.TaskState.SUCCEEDED), plugin_results=(kept,))
    big = Finished(slots.TaskSnapshot.of_result(result))
    small = Accepted(slots.TaskSnapshot.of_result(domain_result(None, slots.TaskState.SUCCEEDED)))
    encoded = stream_responses([small, big, big, big, small, small])
    counts = [len(RunTasksResponse.parse(one.data).events) for one in encoded]
    assert counts == [4, 2]  # the first passes 1 MiB with its third large event
    assert sum(counts) == 6
    assert stream_responses([]) == []


def test_a_live_task_has_no_result_on_the_wire() -> None:
    live = slots.TaskSnapshot(
        task_id="live", slot_id="slot-1", state=slots.TaskState.RUNNING, phase=slots.TaskPhase.CALLS
    )
    update = TaskUpdate.parse(task_update(live).data)
    assert update == TaskUpdate(
        task_id="live", state=TaskState.RUNNING, phase=TaskPhase.CALLS, is_terminal=False
    )
    assert update.result is None
