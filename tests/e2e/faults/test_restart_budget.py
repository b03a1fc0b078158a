"""Fault: every executor crashes until its restart budget is spent.

Each task's call kills the executor that runs it. Once both executors have used
their restarts within the window, the pool backs off before starting them again.
Meanwhile the worker says it is not ready: health NOT_SERVING, status not ready,
reservations refused UNAVAILABLE. Every task ends once, FAILED EXECUTOR_LOST.
After the back-off the executors return, the worker is ready, and it serves.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import trio
from grpclib.const import Status
from grpclib.exceptions import GRPCError
from grpclib.health.v1.health_grpc import HealthStub
from grpclib.health.v1.health_pb2 import HealthCheckRequest, HealthCheckResponse

from blockx._proto.blockx.worker import v1 as pb
from tests.e2e.processes import alive, wait_exited
from tests.e2e.serve_process import ServeProcess, serve_process

FUNCTIONS = """
import os


def crash():
    os._exit(3)


def ok():
    return "ok"
"""
CONFIG = {
    "executorRestartDelayMs": 100,
    "executorMaxRestarts": 1,
    "executorRestartWindowMs": 60_000,
    "executorRestartBackoffMs": 3_000,
}
EXECUTORS = ("executor-0", "executor-1")


def task(task_id: str, function: str) -> pb.TaskSpec:
    payload = {"calls": [{"function": f"m.{function}", "args": []}]}
    return pb.TaskSpec(
        task_id=task_id,
        function_call=pb.FunctionCallConfig(type="call_list"),
        payload=json.dumps(payload).encode(),
        result_handler=pb.ResultHandler(type="result"),
        call_retry_policy=pb.CallRetryPolicy(max_attempts=1),
    )


async def terminal(worker: ServeProcess, task_id: str) -> pb.TaskResult:
    updates = [u for u in await worker.watch(task_id) if u.is_terminal]
    assert len(updates) == 1  # one terminal result, exactly
    assert updates[0].result is not None
    return updates[0].result


async def health(worker: ServeProcess) -> int:
    response = await worker.call(HealthStub(worker.channel).Check, HealthCheckRequest())
    assert isinstance(response, HealthCheckResponse)
    return int(response.status)


def backing_off(worker: ServeProcess) -> set[str]:
    log = "\n".join(worker.log)
    return {executor for executor in EXECUTORS if f"executor {executor} restarted" in log}


async def test_spent_restart_budgets_make_the_worker_not_ready_until_the_back_off_ends(
    tmp_path: Path,
) -> None:
    functions = tmp_path / "functions"
    functions.mkdir()
    (functions / "m.py").write_text(FUNCTIONS)
    config = tmp_path / "worker.json"
    config.write_text(json.dumps(CONFIG))
    args = ("--executors", "2", "--functions", str(functions))
    results: list[pb.TaskResult] = []
    refusals: list[GRPCError] = []
    with trio.fail_after(60):
        async with serve_process(*args, env={"WORKER_CONFIG": str(config)}) as worker:
            # Crash executors until both back off (a refusal while one restarts is fine).
            while backing_off(worker) != set(EXECUTORS):
                task_id = f"crash-{len(results)}"
                request = pb.SubmitTaskRequest(task=task(task_id, "crash"))
                try:
                    await worker.call(worker.stub.submit_task, request)
                except GRPCError as refused:
                    refusals.append(refused)
                    await worker.logged.wait()
                    continue
                results.append(await terminal(worker, task_id))
            # The readiness change that follows the later back-off.
            last_off = max(i for i, line in enumerate(worker.log) if "restarted" in line)
            down = await worker.wait_for_line("no executor is up", last_off)
            down_health = await health(worker)
            down_status = await worker.call(
                worker.stub.get_worker_status, pb.GetWorkerStatusRequest()
            )
            try:
                await worker.call(
                    worker.stub.request_task_slot, pb.RequestTaskSlotRequest(task_id="early")
                )
            except GRPCError as refused:
                refusals.append(refused)
            else:
                raise AssertionError("a reservation was admitted while no executor was up")

            await worker.wait_for_line("an executor is up again", down)
            up_health = await health(worker)
            await worker.call(worker.stub.submit_task, pb.SubmitTaskRequest(task=task("t", "ok")))
            served = await terminal(worker, "t")
            status = await worker.call(worker.stub.get_worker_status, pb.GetWorkerStatusRequest())
            dead = {int(pid) for pid in re.findall(r"\(pid (\d+)\) is down", "\n".join(worker.log))}
            for pid in dead:
                await wait_exited(pid)

    assert len(results) >= 2
    assert {(r.state, r.failure_code) for r in results} == {(pb.TaskState.FAILED, "EXECUTOR_LOST")}
    assert down_health == HealthCheckResponse.NOT_SERVING
    assert isinstance(down_status, pb.GetWorkerStatusResponse)
    assert down_status.ready is False
    assert refusals
    assert {r.status for r in refusals} == {Status.UNAVAILABLE}
    assert "not ready (no executor is healthy)" in str(refusals[-1].message)
    assert up_health == HealthCheckResponse.SERVING
    assert (served.state, json.loads(served.outputs_json)) == (pb.TaskState.SUCCEEDED, ["ok"])
    assert isinstance(status, pb.GetWorkerStatusResponse)
    assert status.ready is True
    assert status.free_slots == status.slots_total  # no slot stays taken
    assert len(dead) >= 4  # each executor died twice at least
    assert not any(alive(pid) for pid in dead)  # no orphan
    assert any("no executor is up" in line for line in worker.log)
