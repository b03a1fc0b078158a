"""Requests no well-behaved gRPC client sends, to an in-process worker over real gRPC.

Each is answered with a precise status and a message (never UNKNOWN, a traceback
or silence), the worker goes on serving, and nothing is logged at ERROR. Bodies go
out raw through grpcio.
"""

from __future__ import annotations

import logging

import grpc
import pytest
import trio
import trio_asyncio

from blockx._proto.blockx.worker import v1 as pb
from blockx.api import STATUS_MESSAGE_CHARS, grpc_error
from blockx.slots import MAX_TASK_ID_CHARS, NoSlot
from tests.adapters.worker_harness import Harness, call_list_task, running_worker, worker_config

TIMEOUT_S = 20
WORKER_SERVICE = "/blockx.worker.v1.WorkerService/"


def send(
    port: int, method: str, *bodies: bytes, streaming: bool = False
) -> tuple[grpc.StatusCode, list[bytes], str]:
    """Call `method` with `bodies` as they are: (status, reply bodies, status message)."""
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        path = WORKER_SERVICE + method
        try:
            if method == "RunTasks":
                replies = list(channel.stream_stream(path)(iter(bodies), timeout=TIMEOUT_S))
            elif streaming:
                replies = list(channel.unary_stream(path)(bodies[0], timeout=TIMEOUT_S))
            else:
                replies = [channel.unary_unary(path)(bodies[0], timeout=TIMEOUT_S)]
        except grpc.RpcError as error:
            return error.code(), [], error.details() or ""
    return grpc.StatusCode.OK, replies, ""


async def sent(
    worker: Harness, method: str, *bodies: bytes, streaming: bool = False
) -> tuple[grpc.StatusCode, list[bytes], str]:
    return await trio.to_thread.run_sync(
        lambda: send(worker.serving.port, method, *bodies, streaming=streaming)
    )


async def still_serves(worker: Harness) -> None:
    """A task submitted now runs to success."""
    task = call_list_task("after", ("demo.add", [1, 2]))
    await worker.call(worker.stub.submit_task, pb.SubmitTaskRequest(task=task))
    stream = worker.stub.watch_tasks(pb.WatchTasksRequest(task_ids=["after"]))
    updates = [update async for update in trio_asyncio.aio_as_trio(stream)]
    assert updates[-1].state == pb.TaskState.SUCCEEDED


def errors_logged(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


async def test_a_string_field_that_arrives_as_a_number_is_an_unknown_field(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # task_id (field 1) as the varint 5: protobuf reads it as an unknown field. The
    # worker once handed the int to its slot table, which died of it, and the worker
    # with it.
    with trio.fail_after(TIMEOUT_S):
        async with running_worker() as worker:
            status, _, message = await sent(worker, "RequestTaskSlot", b"\x08\x05")
            assert status is grpc.StatusCode.INVALID_ARGUMENT
            assert message.startswith("task_id='' is invalid")
            status, replies, _ = await sent(worker, "GetWorkerStatus", b"\x08\x05")
            assert status is grpc.StatusCode.OK
            assert pb.GetWorkerStatusResponse.parse(replies[0]).slots_total == 4
            await still_serves(worker)
    assert errors_logged(caplog) == []


@pytest.mark.parametrize("length", [MAX_TASK_ID_CHARS + 1, 1_000_000])
async def test_an_overlong_task_id_is_refused_in_a_short_message_by_every_rpc(
    length: int, caplog: pytest.LogCaptureFixture
) -> None:
    # Quoted whole, a megabyte id made the status header take minutes to encode (HPACK
    # is quadratic in a value's length) and broke grpcio's metadata limit.
    task_id = "t" * length
    requests = {
        "RequestTaskSlot": bytes(pb.RequestTaskSlotRequest(task_id=task_id)),
        "SubmitTask": bytes(pb.SubmitTaskRequest(task=call_list_task(task_id))),
        "GetTaskResult": bytes(pb.GetTaskResultRequest(task_id=task_id)),
        "WatchTasks": bytes(pb.WatchTasksRequest(task_ids=["ok", task_id])),
    }
    with trio.fail_after(TIMEOUT_S):
        async with running_worker(worker_config(grpcMaxMessageBytes=2_000_000)) as worker:
            for method, body in requests.items():
                status, _, message = await sent(
                    worker, method, body, streaming=method == "WatchTasks"
                )
                field = "task_ids[1]" if method == "WatchTasks" else "task_id"
                assert (method, status) == (method, grpc.StatusCode.INVALID_ARGUMENT)
                assert message.startswith(f"{field}='{'t' * 76}...")
                assert len(message) < 200
            longest = "t" * MAX_TASK_ID_CHARS
            reply = await worker.call(
                worker.stub.request_task_slot, pb.RequestTaskSlotRequest(task_id=longest)
            )
            assert reply.task_id == longest
    assert errors_logged(caplog) == []


async def test_an_undefined_call_failure_policy_is_refused_naming_the_field() -> None:
    task = call_list_task("policy", ("demo.add", [1, 2]), call_failure_policy=7)
    with trio.fail_after(TIMEOUT_S):
        async with running_worker() as worker:
            status, _, message = await sent(
                worker, "SubmitTask", bytes(pb.SubmitTaskRequest(task=task))
            )
            assert status is grpc.StatusCode.INVALID_ARGUMENT
            assert message.startswith("task.call_failure_policy=7 is invalid")
            request = bytes(pb.RunTasksRequest(task=task))
            status, replies, _ = await sent(worker, "RunTasks", request)
            assert status is grpc.StatusCode.OK
            (event,) = pb.RunTasksResponse.parse(replies[0]).events
            assert event.refused is not None
            assert (event.refused.task_id, event.refused.status) == ("policy", 3)
            assert event.refused.message.startswith("task.call_failure_policy=7 is invalid")
            assert worker.calls.started == []


def test_a_status_message_is_never_longer_than_its_bound() -> None:
    error = grpc_error(NoSlot(task_id="t" * 10_000, task_slots=4))
    assert error.message is not None
    assert len(error.message) == STATUS_MESSAGE_CHARS
    assert error.message.endswith("...")
