"""Faults: a coordinator's watch connection dropped mid-task. With the disconnect grace
off (the default) the task runs to its end; with it on, the task ends WATCH_DISCONNECTED
once the grace passes with no watch back, its running call is stopped and its slot freed."""

from __future__ import annotations

import json

import pytest
import trio
import trio_asyncio
from grpclib.client import Channel

from blockx._proto.blockx.worker import v1 as pb
from tests.e2e.serve_process import ServeProcess, serve_process


def sleeping_task(task_id: str, seconds: float) -> pb.TaskSpec:
    payload = {"calls": [{"function": "demo.sleep", "args": [seconds]}]}
    return pb.TaskSpec(
        task_id=task_id,
        function_call=pb.FunctionCallConfig(type="call_list"),
        payload=json.dumps(payload).encode(),
    )


async def watch_then_drop(port: int, task_id: str) -> None:
    """Open a watch on its own connection, read the first update, drop the connection."""

    async def watch_once() -> None:
        channel = Channel("127.0.0.1", port)
        try:
            stub = pb.WorkerServiceStub(channel)
            async for update in stub.watch_tasks(pb.WatchTasksRequest(task_ids=[task_id])):
                assert not update.is_terminal
                break
        finally:
            channel.close()  # no clean end of the stream: the connection just goes

    await trio_asyncio.aio_as_trio(watch_once)()


async def result_of(worker: ServeProcess, task_id: str) -> pb.TaskResult:
    """Its terminal result, read without watching (a watch would attach and end a grace):
    once the worker logged that the task finished."""
    finished = f'"task_id": "{task_id}"'
    while not any("task_finished" in line and finished in line for line in worker.log):
        await worker.logged.wait()
    answer = await worker.call(
        worker.stub.get_task_result, pb.GetTaskResultRequest(task_id=task_id)
    )
    assert isinstance(answer, pb.GetTaskResultResponse)
    assert answer.result is not None
    return answer.result


@pytest.mark.parametrize("grace_ms", [0, 300], ids=["grace-off", "grace-on"])
async def test_a_watch_dropped_mid_task(grace_ms: int) -> None:
    env = {"WATCH_DISCONNECT_GRACE_MS": str(grace_ms)}
    with trio.fail_after(60):
        async with serve_process("--executors", "1", env=env) as worker:
            await worker.call(
                worker.stub.submit_task, pb.SubmitTaskRequest(task=sleeping_task("t1", 1.5))
            )
            await watch_then_drop(worker.port, "t1")
            result = await result_of(worker, "t1")
            status = await worker.call(worker.stub.get_worker_status, pb.GetWorkerStatusRequest())
            await worker.call(
                worker.stub.submit_task, pb.SubmitTaskRequest(task=sleeping_task("t2", 0))
            )
            after = await result_of(worker, "t2")
    assert isinstance(status, pb.GetWorkerStatusResponse)
    assert status.free_slots == status.slots_total
    assert after.state == pb.TaskState.SUCCEEDED
    if grace_ms == 0:
        assert (result.state, result.failure_code) == (pb.TaskState.SUCCEEDED, "")
    else:
        assert (result.state, result.failure_code) == (pb.TaskState.FAILED, "WATCH_DISCONNECTED")
        assert result.timings is not None
        assert result.timings.total_ms < 1_500  # ended by the grace, not by the call
