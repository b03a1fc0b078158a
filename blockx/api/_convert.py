"""Protocol buffers <-> domain values, and domain errors -> gRPC statuses.

Conversion never validates beyond shape: the slot table checks every field
and refuses with an error that names it.
"""

from __future__ import annotations

from typing import Any

import attrs
from google.protobuf import message_factory  # type: ignore[import-untyped]  # no stubs
from grpclib.const import Status
from grpclib.exceptions import GRPCError

from blockx._proto.blockx.worker import v1 as pb
from blockx._proto.google_proto_descriptor_pool import default_google_proto_descriptor_pool
from blockx.actors import Accepted, Finished, Refused, StreamEvent
from blockx.calls import CallFailurePolicy, RetryPolicy
from blockx.slots import (
    ErrorCode,
    FunctionCall,
    InvalidArgument,
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


STATUS_MESSAGE_CHARS = 1024
"""The longest status message sent. It travels as the `grpc-message` header, which
clients bound (grpcio refuses more than 16 KiB of metadata) and which HPACK encodes in
time that grows with the square of its length: a message quoting megabytes of a request
held the server's loop for minutes."""


def status_message(error: WorkerError) -> str:
    """What a client is told about `error`, at most `STATUS_MESSAGE_CHARS` long."""
    text = str(error)
    if len(text) <= STATUS_MESSAGE_CHARS:
        return text
    return text[: STATUS_MESSAGE_CHARS - 3] + "..."


def grpc_error(error: WorkerError) -> GRPCError:
    return GRPCError(STATUS_OF[error.code], status_message(error))


_FAILURE_POLICY_OF = {
    pb.CallFailurePolicy.UNSPECIFIED.value: CallFailurePolicy.FAIL_FAST,
    pb.CallFailurePolicy.FAIL_FAST.value: CallFailurePolicy.FAIL_FAST,
    pb.CallFailurePolicy.BEST_EFFORT.value: CallFailurePolicy.BEST_EFFORT,
}


def spec_from_wire(task: Any) -> TaskSpec:
    """The domain spec of a `TaskSpec` message as the protobuf runtime decoded it.

    `InvalidArgument` for an enum number the API does not define (proto3 keeps them):
    no policy is guessed for a task.
    """
    call = task.function_call
    retry = task.call_retry_policy
    policy = _FAILURE_POLICY_OF.get(task.call_failure_policy)
    if policy is None:
        raise InvalidArgument(
            field="task.call_failure_policy",
            value=task.call_failure_policy,
            allowed="0 (unspecified: FAIL_FAST), 1 (FAIL_FAST) or 2 (BEST_EFFORT)",
        )
    return TaskSpec(
        task_id=task.task_id,
        function_call=FunctionCall(type=call.type, config_json=call.config_json),
        payload=task.payload,
        result_handler=(
            ResultHandler(
                type=task.result_handler.type, config_json=task.result_handler.config_json
            )
            if task.HasField("result_handler")
            else None
        ),
        task_timeout_ms=task.task_timeout_ms,
        call_failure_policy=policy,
        call_retry_policy=(
            RetryPolicy(
                max_attempts=retry.max_attempts,
                base_backoff_ms=retry.base_backoff_ms,
                jitter_percent=retry.jitter_percent,
                at_most_once=retry.at_most_once,
            )
            if task.HasField("call_retry_policy")
            else None
        ),
        labels=dict(task.labels),
    )


# ------------------------------------------------ the hot messages, in the C runtime
#
# Every request is decoded, and every reply about a task is built, by the
# official protobuf runtime's C implementation (upb), straight
# from and into domain values; replies go out as bytes (`Encoded`).
# betterproto2 took about 40x longer to encode a terminal update and made
# encoding the largest cost of a task. The message types are the ones the
# betterproto2 modules register in their descriptor pool, so the bytes are the
# API's messages: tests/core/test_proto.py reads them back with betterproto2.


def _upb(name: str) -> Any:
    descriptor = default_google_proto_descriptor_pool.FindMessageTypeByName(
        f"blockx.worker.v1.{name}"
    )
    return message_factory.GetMessageClass(descriptor)


WIRE_REQUESTS: dict[str, Any] = {
    name: _upb(f"{name}Request")
    for name in (
        "RequestTaskSlot",
        "SubmitTask",
        "RunTasks",
        "WatchTasks",
        "GetTaskResult",
        "GetWorkerStatus",
    )
}
"""The request type of each RPC (by method name), as the C runtime decodes it."""
_SlotReply = _upb("RequestTaskSlotResponse")
_SubmitReply = _upb("SubmitTaskResponse")
_ResultReply = _upb("GetTaskResultResponse")
_Update = _upb("TaskUpdate")
_TaskSpec = _upb("TaskSpec")
_TaskResult = _upb("TaskResult")
_StreamReply = _upb("RunTasksResponse")
_STATE_NUMBER = {state: number.value for state, number in _STATE_TO_PB.items()}
_PHASE_NUMBER = {phase: number.value for phase, number in _PHASE_TO_PB.items()}


@attrs.frozen
class Encoded:
    """A reply whose protobuf bytes are already made; the codec sends them as they are."""

    data: bytes


def _fill_result(out: Any, result: TaskResult) -> None:
    out.task_id = result.task_id
    out.state = _STATE_NUMBER[result.state]
    out.phase = _PHASE_NUMBER[result.phase]
    if result.failure_code is not None:
        out.failure_code = result.failure_code.value
    out.message = result.message
    out.retryable = result.retryable
    execute = out.execute_result
    execute.SetInParent()
    execute.output_count = result.output_count
    execute.output_bytes = result.output_bytes
    for plugin in result.plugin_results:
        execute.plugin_results.add(
            plugin_type=plugin.plugin_type,
            ok=plugin.ok,
            records_written=plugin.records_written,
            detail=plugin.detail,
        )
    timings = result.timings
    out.timings.SetInParent()
    out.timings.preparing_ms = timings.preparing_ms
    out.timings.builder_ms = timings.builder_ms
    out.timings.calls_ms = timings.calls_ms
    out.timings.plugin_ms = timings.plugin_ms
    out.timings.total_ms = timings.total_ms
    stats = result.call_stats
    out.call_stats.SetInParent()
    out.call_stats.calls_total = stats.calls_total
    out.call_stats.calls_succeeded = stats.calls_succeeded
    out.call_stats.calls_failed = stats.calls_failed
    out.call_stats.calls_retried = stats.calls_retried
    out.task_code_epoch = result.task_code_epoch
    out.accepted_at_ms = result.accepted_at_ms
    out.finished_at_ms = result.finished_at_ms
    out.outputs_json = result.outputs_json


def spec_from_message(task: Any) -> TaskSpec:
    """The domain spec of a client's `TaskSpec` (a betterproto2 message), read as a request
    carrying it is; `InvalidArgument` as `spec_from_wire` raises it."""
    return spec_from_wire(_TaskSpec.FromString(bytes(task)))


def result_message(result: TaskResult) -> Any:
    """`result` as the API's `TaskResult` message, in the C runtime."""
    out = _TaskResult()
    _fill_result(out, result)
    return out


def _fill(out: Any, snapshot: TaskSnapshot) -> Any:
    """The fields every reply about one task shares; returns `out`."""
    out.task_id = snapshot.task_id
    out.state = _STATE_NUMBER[snapshot.state]
    out.phase = _PHASE_NUMBER[snapshot.phase]
    if snapshot.result is not None:
        _fill_result(out.result, snapshot.result)
    return out


def slot_response(snapshot: TaskSnapshot) -> Encoded:
    out = _fill(_SlotReply(), snapshot)
    out.slot_id = snapshot.slot_id
    out.lease_expires_at_ms = snapshot.lease_expires_at_ms or 0
    return Encoded(out.SerializeToString())


def submit_response(snapshot: TaskSnapshot) -> Encoded:
    return Encoded(_submit(_SubmitReply(), snapshot).SerializeToString())


def _submit(out: Any, snapshot: TaskSnapshot) -> Any:
    _fill(out, snapshot).slot_id = snapshot.slot_id
    return out


def result_response(snapshot: TaskSnapshot) -> Encoded:
    return Encoded(_fill(_ResultReply(), snapshot).SerializeToString())


def task_update(snapshot: TaskSnapshot) -> Encoded:
    return Encoded(_update(_Update(), snapshot).SerializeToString())


def _update(out: Any, snapshot: TaskSnapshot) -> Any:
    _fill(out, snapshot).is_terminal = snapshot.is_terminal
    return out


STREAM_BATCH_BYTES = 1 << 20
"""A `RunTasks` response holds events up to this size (one larger event goes alone)."""


def stream_responses(events: list[StreamEvent]) -> list[Encoded]:
    """`events` as few `RunTasksResponse`s as `STREAM_BATCH_BYTES` allows, in order."""
    responses: list[Encoded] = []
    out = _StreamReply()
    size = 0
    for event in events:
        one = out.events.add()
        match event:
            case Accepted(snapshot=snapshot):
                _submit(one.accepted, snapshot)
            case Refused(task_id=task_id, error=error):
                one.refused.task_id = task_id
                one.refused.status = STATUS_OF[error.code].value
                one.refused.message = status_message(error)
            case Finished(snapshot=snapshot):
                _update(one.finished, snapshot)
        size += one.ByteSize()
        if size >= STREAM_BATCH_BYTES:
            responses.append(Encoded(out.SerializeToString()))
            out = _StreamReply()
            size = 0
    if size:
        responses.append(Encoded(out.SerializeToString()))
    return responses
