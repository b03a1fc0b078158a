"""Faults: a call that will not end by itself. A timed-out task's call is interrupted in
its executor at once, nothing waits behind it, and an executor that cannot be interrupted
(a call holding the interpreter in C) is replaced after the cancel grace."""

from __future__ import annotations

import json
import time
from pathlib import Path

import trio

from blockx._proto.blockx.worker import v1 as pb
from tests.e2e.serve_process import ServeProcess, serve_process

FUNCTIONS = """
def spin():
    while True:
        pass


def hold_in_c():
    return sum(range(10**13))  # minutes in C, never between two bytecodes


def quick(x):
    return x
"""


def task(task_id: str, function: str, *args: object, timeout_ms: int = 0) -> pb.TaskSpec:
    payload = {"calls": [{"function": function, "args": list(args)}]}
    return pb.TaskSpec(
        task_id=task_id,
        function_call=pb.FunctionCallConfig(type="call_list"),
        payload=json.dumps(payload).encode(),
        result_handler=pb.ResultHandler(type="result"),
        task_timeout_ms=timeout_ms,
    )


async def run_both(
    worker: ServeProcess, runaway: str
) -> tuple[pb.TaskResult, pb.TaskResult, float]:
    """A runaway task (0.5 s deadline) and, behind it on the one executor, a quick one;
    their results, and the seconds from the submits to the quick one's end."""
    started = time.monotonic()
    await worker.call(
        worker.stub.submit_task, pb.SubmitTaskRequest(task=task("runaway", runaway, timeout_ms=500))
    )
    await worker.call(
        worker.stub.submit_task, pb.SubmitTaskRequest(task=task("quick", "m.quick", 7))
    )
    [quick] = [u.result for u in await worker.watch("quick") if u.is_terminal]
    took = time.monotonic() - started
    [stopped] = [u.result for u in await worker.watch("runaway") if u.is_terminal]
    assert quick is not None
    assert stopped is not None
    return stopped, quick, took


async def restarts(worker: ServeProcess) -> int:
    status = await worker.call(worker.stub.get_worker_status, pb.GetWorkerStatusRequest())
    assert isinstance(status, pb.GetWorkerStatusResponse)
    return sum(executor.restarts for executor in status.executors)


def functions_dir(tmp_path: Path) -> str:
    directory = tmp_path / "functions"
    directory.mkdir()
    (directory / "m.py").write_text(FUNCTIONS)
    return str(directory)


async def test_a_spinning_call_is_interrupted_and_the_next_task_does_not_wait(
    tmp_path: Path,
) -> None:
    args = ("--executors", "1", "--functions", functions_dir(tmp_path))
    with trio.fail_after(60):
        async with serve_process(*args) as worker:
            stopped, quick, took = await run_both(worker, "m.spin")
            after = await run_both(worker, "m.spin")  # the same executor serves on
            replaced = await restarts(worker)
    assert (stopped.state, stopped.failure_code) == (pb.TaskState.FAILED, "TIMED_OUT")
    assert (quick.state, json.loads(quick.outputs_json)) == (pb.TaskState.SUCCEEDED, [7])
    assert took < 1.5, f"the quick task took {took:.2f} s behind the runaway one"
    assert after[1].state == pb.TaskState.SUCCEEDED
    assert replaced == 0  # interrupted, not killed
    assert not any("did not stop a cancelled call" in line for line in worker.log)


async def test_a_call_that_cannot_be_interrupted_has_its_executor_replaced(
    tmp_path: Path,
) -> None:
    args = ("--executors", "1", "--functions", functions_dir(tmp_path))
    env = {"EXECUTOR_CANCEL_GRACE_MS": "500", "EXECUTOR_RESTART_DELAY_MS": "100"}
    with trio.fail_after(60):
        async with serve_process(*args, env=env) as worker:
            stopped, quick, took = await run_both(worker, "m.hold_in_c")
            replaced = await restarts(worker)
    assert (stopped.state, stopped.failure_code) == (pb.TaskState.FAILED, "TIMED_OUT")
    assert (quick.state, json.loads(quick.outputs_json)) == (pb.TaskState.SUCCEEDED, [7])
    assert took < 5, f"the quick task took {took:.2f} s"
    assert replaced == 1
    [killed] = [line for line in worker.log if "did not stop a cancelled call" in line]
    assert "the cancel grace is 500 ms" in killed
