"""Protocol buffers <-> domain values, and domain errors -> gRPC statuses.

Conversion never validates beyond shape: the slot table checks every field
and refuses with an error that names it.
"""

from __future__ import annotations

from grpclib.const import Status
from grpclib.exceptions import GRPCError

from blockx._proto.blockx.worker import v1 as pb
from blockx.actors import Accepted, Finished, Refused, StreamEvent
from blockx.calls import CallFailurePolicy, RetryPolicy
from blockx.slots import (
    ErrorCode,
    FunctionCall,
    ResultHandler,
    TaskPhase,
    TaskResult,
    TaskSnapshot,
    TaskSpec,
    TaskState,
    WorkerError,
)

STATUS_OF: dict[ErrorCode, Status] = {
    ErrorCode.INVALID_ARGUMENT: Status.INVALID_ARGUMENT,
    ErrorCode.NO_SLOT: Status.RESOURCE_EXHAUSTED,
    ErrorCode.UNAVAILABLE: Status.UNAVAILABLE,
    ErrorCode.INVALID_SLOT: Status.FAILED_PRECONDITION,
    ErrorCode.NOT_FOUND: Status.NOT_FOUND,
    ErrorCode.SLOT_UNCERTAIN: Status.ABORTED,
}

# The protobuf enums spell every member as the domain's do.
_STATE_TO_PB = {state: pb.TaskState[state.value] for state in TaskState}
_PHASE_TO_PB = {None: pb.TaskPhase.UNSPECIFIED} | {
    phase: pb.TaskPhase[phase.value] for phase in TaskPhase
}


def grpc_error(error: WorkerError) -> GRPCError:
    return GRPCError(STATUS_OF[error.code], str(error))


def spec_from_pb(task: pb.TaskSpec) -> TaskSpec:
    call = task.function_call
    handler = task.result_handler
    retry = task.call_retry_policy
    return TaskSpec(
        task_id=task.task_id,
        function_call=FunctionCall(
            type=call.type if call else "", config_json=call.config_json if call else ""
        ),
        payload=task.payload,
        result_handler=(
            ResultHandler(type=handler.type, config_json=handler.config_json)
            if handler is not None
            else None
        ),
        task_timeout_ms=task.task_timeout_ms,
        call_failure_policy=(
            CallFailurePolicy.BEST_EFFORT
            if task.call_failure_policy == pb.CallFailurePolicy.BEST_EFFORT
            else CallFailurePolicy.FAIL_FAST
        ),
        call_retry_policy=(
            RetryPolicy(
                max_attempts=retry.max_attempts,
                base_backoff_ms=retry.base_backoff_ms,
                jitter_percent=retry.jitter_percent,
            )
            if retry is not None
            else None
        ),
        labels=dict(task.labels),
    )


def state_to_pb(state: TaskState) -> pb.TaskState:
    return _STATE_TO_PB[state]


def phase_to_pb(phase: TaskPhase | None) -> pb.TaskPhase:
    return _PHASE_TO_PB[phase]


def result_to_pb(result: TaskResult) -> pb.TaskResult:
    stats = result.call_stats
    timings = result.timings
    return pb.TaskResult(
        task_id=result.task_id,
        state=_STATE_TO_PB[result.state],
        phase=_PHASE_TO_PB[result.phase],
        failure_code=result.failure_code.value if result.failure_code else "",
        message=result.message,
        retryable=result.retryable,
        execute_result=pb.ExecuteResult(
            output_count=result.output_count,
            output_bytes=result.output_bytes,
            plugin_results=[
                pb.PluginResult(
                    plugin_type=plugin.plugin_type,
                    ok=plugin.ok,
                    records_written=plugin.records_written,
                    detail=plugin.detail,
                )
                for plugin in result.plugin_results
            ],
        ),
        timings=pb.PhaseTimings(
            preparing_ms=timings.preparing_ms,
            builder_ms=timings.builder_ms,
            calls_ms=timings.calls_ms,
            plugin_ms=timings.plugin_ms,
            total_ms=timings.total_ms,
        ),
        call_stats=pb.CallStatistics(
            calls_total=stats.calls_total,
            calls_succeeded=stats.calls_succeeded,
            calls_failed=stats.calls_failed,
            calls_retried=stats.calls_retried,
        ),
        task_code_epoch=result.task_code_epoch,
        accepted_at_ms=result.accepted_at_ms,
        finished_at_ms=result.finished_at_ms,
        outputs_json=result.outputs_json,
    )


def _result_or_none(snapshot: TaskSnapshot) -> pb.TaskResult | None:
    return result_to_pb(snapshot.result) if snapshot.result is not None else None


def slot_response(snapshot: TaskSnapshot) -> pb.RequestTaskSlotResponse:
    return pb.RequestTaskSlotResponse(
        task_id=snapshot.task_id,
        slot_id=snapshot.slot_id,
        state=_STATE_TO_PB[snapshot.state],
        phase=_PHASE_TO_PB[snapshot.phase],
        lease_expires_at_ms=snapshot.lease_expires_at_ms or 0,
        result=_result_or_none(snapshot),
    )


def submit_response(snapshot: TaskSnapshot) -> pb.SubmitTaskResponse:
    return pb.SubmitTaskResponse(
        task_id=snapshot.task_id,
        slot_id=snapshot.slot_id,
        state=_STATE_TO_PB[snapshot.state],
        phase=_PHASE_TO_PB[snapshot.phase],
        result=_result_or_none(snapshot),
    )


def result_response(snapshot: TaskSnapshot) -> pb.GetTaskResultResponse:
    return pb.GetTaskResultResponse(
        task_id=snapshot.task_id,
        state=_STATE_TO_PB[snapshot.state],
        phase=_PHASE_TO_PB[snapshot.phase],
        result=_result_or_none(snapshot),
    )


def task_update(snapshot: TaskSnapshot) -> pb.TaskUpdate:
    return pb.TaskUpdate(
        task_id=snapshot.task_id,
        state=_STATE_TO_PB[snapshot.state],
        phase=_PHASE_TO_PB[snapshot.phase],
        is_terminal=snapshot.is_terminal,
        result=_result_or_none(snapshot),
    )


def stream_response(event: StreamEvent) -> pb.RunTasksResponse:
    match event:
        case Accepted(snapshot=snapshot):
            return pb.RunTasksResponse(accepted=submit_response(snapshot))
        case Refused(task_id=task_id, error=error):
            return pb.RunTasksResponse(refused=refusal(task_id, error))
        case Finished(snapshot=snapshot):
            return pb.RunTasksResponse(finished=task_update(snapshot))


def refusal(task_id: str, error: WorkerError) -> pb.TaskRefusal:
    return pb.TaskRefusal(task_id=task_id, status=STATUS_OF[error.code].value, message=str(error))
