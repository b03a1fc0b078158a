"""Faults: an executor process killed (SIGKILL) or frozen (SIGSTOP) in the middle of a call.
The call runs again on a healthy executor and its task ends once, SUCCEEDED; the dead or
frozen process is gone (no orphan); the worker goes on serving."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
import trio

from blockx._proto.blockx.worker import v1 as pb
from tests.e2e.processes import alive, wait_exited
from tests.e2e.serve_process import ServeProcess, serve_process

FUNCTIONS = """
import os
import time


def once(marker):
    '''Leaves its pid in `marker` and waits; run again (the marker there), returns.'''
    if os.path.exists(marker):
        return "again"
    with open(marker + ".tmp", "w") as out:
        out.write(str(os.getpid()))
    os.rename(marker + ".tmp", marker)
    time.sleep(60)
    return "first"
"""
CONFIG = {"executorHeartbeatIntervalMs": 100, "executorHeartbeatTimeoutMs": 1_000}


async def first_attempt_pid(marker: Path) -> int:
    """The pid the first attempt wrote (it is a real process: the test polls for the file)."""
    while not marker.exists():
        await trio.sleep(0.02)
    return int(marker.read_text())


async def terminal(worker: ServeProcess, task_id: str) -> pb.TaskResult:
    updates = [u for u in await worker.watch(task_id) if u.is_terminal]
    assert len(updates) == 1  # one terminal result, exactly
    [update] = updates
    assert update.result is not None
    return update.result


@pytest.mark.parametrize("fault", [signal.SIGKILL, signal.SIGSTOP], ids=["sigkill", "sigstop"])
async def test_an_executor_lost_mid_call_runs_the_call_again_elsewhere(
    tmp_path: Path, fault: signal.Signals
) -> None:
    functions = tmp_path / "functions"
    functions.mkdir()
    (functions / "m.py").write_text(FUNCTIONS)
    config = tmp_path / "worker.json"
    config.write_text(json.dumps(CONFIG))
    marker = tmp_path / "first-attempt"
    payload = {"calls": [{"function": "m.once", "args": [str(marker)]}]}
    task = pb.TaskSpec(
        task_id="t1",
        function_call=pb.FunctionCallConfig(type="call_list"),
        payload=json.dumps(payload).encode(),
        result_handler=pb.ResultHandler(type="result"),
    )
    args = ("--executors", "2", "--functions", str(functions))
    with trio.fail_after(60):
        async with serve_process(*args, env={"WORKER_CONFIG": str(config)}) as worker:
            await worker.call(worker.stub.submit_task, pb.SubmitTaskRequest(task=task))
            pid = await first_attempt_pid(marker)
            os.kill(pid, fault)
            result = await terminal(worker, "t1")
            await wait_exited(pid)  # a frozen one is killed, not left behind
            status = await worker.call(worker.stub.get_worker_status, pb.GetWorkerStatusRequest())
            after = pb.TaskSpec(
                task_id="t2",
                function_call=pb.FunctionCallConfig(type="call_list"),
                payload=json.dumps(payload).encode(),
                result_handler=pb.ResultHandler(type="result"),
            )
            await worker.call(worker.stub.submit_task, pb.SubmitTaskRequest(task=after))
            served = await terminal(worker, "t2")
    assert (result.state, json.loads(result.outputs_json)) == (pb.TaskState.SUCCEEDED, ["again"])
    assert result.call_stats is not None
    assert result.call_stats.calls_retried == 1
    assert not alive(pid)
    assert isinstance(status, pb.GetWorkerStatusResponse)
    assert status.free_slots == status.slots_total  # t1 ended: no slot stays taken
    assert served.state == pb.TaskState.SUCCEEDED  # the worker serves on
    down = "LOST" if fault is signal.SIGSTOP else "EXITED"
    assert any(f"is down: {down}" in line for line in worker.log), down
