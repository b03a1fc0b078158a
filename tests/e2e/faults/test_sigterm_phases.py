"""Fault: SIGTERM while tasks are in every phase, and a slot is only reserved.

The worker drains: new work is refused UNAVAILABLE at once, a task that finishes
within the drain timeout SUCCEEDS, and when it passes, each task still in its
builder (a DuckDB query), calls or plugin ends once, FAILED WORKER_SHUTDOWN in that
phase (retryable). The process exits 0 and leaves no executor behind.
"""

from __future__ import annotations

import json
import signal

import trio
from grpclib.const import Status
from grpclib.exceptions import GRPCError

from blockx._proto.blockx.worker import v1 as pb
from tests.e2e.processes import alive, wait_exited
from tests.e2e.serve_process import ServeProcess, serve_process

SLOW_QUERY = "SELECT count(*) AS n FROM range(3000000000) WHERE hash(range) % 7 = 0"


def call_list(task_id: str, function: str, *args: object, **fields: object) -> pb.TaskSpec:
    payload = {"calls": [{"function": function, "args": list(args)}]}
    return pb.TaskSpec(
        task_id=task_id,
        function_call=pb.FunctionCallConfig(type="call_list"),
        payload=json.dumps(payload).encode(),
        **fields,  # type: ignore[arg-type]
    )


TASKS = {
    "quick": call_list("quick", "demo.sleep", 0.3),
    "builder": pb.TaskSpec(
        task_id="builder",
        function_call=pb.FunctionCallConfig(
            type="dbscan",
            config_json=json.dumps({"query": SLOW_QUERY, "function": "demo.echo"}),
        ),
    ),
    "calls": call_list("calls", "demo.sleep", 60),
    "plugin": call_list(
        "plugin",
        "demo.sleep",
        0,
        result_handler=pb.ResultHandler(type="test", config_json='{"delay_ms": 60000}'),
    ),
}
PHASES = {
    "builder": pb.TaskPhase.BUILDER,
    "calls": pb.TaskPhase.CALLS,
    "plugin": pb.TaskPhase.PLUGIN,
}


async def test_sigterm_ends_a_task_in_each_phase_once_and_the_worker_exits_clean() -> None:
    env = {"DRAIN_TIMEOUT_MS": "2000"}
    async with serve_process("--executors", "2", "--slots", "6", env=env) as worker:
        status = await worker.call(worker.stub.get_worker_status, pb.GetWorkerStatusRequest())
        pids = [executor.pid for executor in status.executors]  # type: ignore[attr-defined]
        await worker.call(
            worker.stub.request_task_slot, pb.RequestTaskSlotRequest(task_id="reserved")
        )
        for task in TASKS.values():
            await worker.call(worker.stub.submit_task, pb.SubmitTaskRequest(task=task))
        seen: list[pb.TaskUpdate] = []
        attached = trio.Event()

        async def follow() -> None:
            seen.extend(await worker.watch(*TASKS, attached=attached))

        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(follow)
                await attached.wait()
                phases = await phases_reached(worker)
                worker.process.send_signal(signal.SIGTERM)
                await worker.wait_for_line("draining: admitting no new tasks")
                try:
                    late = pb.SubmitTaskRequest(task=call_list("late", "demo.sleep", 0))
                    await worker.call(worker.stub.submit_task, late)
                except GRPCError as refused:
                    refusal = refused
                else:
                    raise AssertionError("a task was admitted during the drain")
            code = await worker.process.wait()
            for pid in pids:
                await wait_exited(pid)

    assert phases == PHASES  # each task was in its phase when the signal came
    assert refusal.status is Status.UNAVAILABLE
    assert "draining" in str(refusal.message)
    terminal = [update for update in seen if update.is_terminal]
    assert sorted(update.task_id for update in terminal) == sorted(TASKS)  # once each
    results = {update.task_id: update.result for update in terminal}
    quick = results.pop("quick")
    assert quick is not None
    assert quick.state == pb.TaskState.SUCCEEDED  # finished within the drain timeout
    ended = {
        task_id: (result.state, result.failure_code, result.retryable, result.phase)
        for task_id, result in results.items()
        if result is not None
    }
    assert ended == {
        task_id: (pb.TaskState.FAILED, "WORKER_SHUTDOWN", True, phase)
        for task_id, phase in PHASES.items()
    }
    assert code == 0, "\n".join(worker.log)
    assert not any(alive(pid) for pid in pids)  # no orphaned executor


async def phases_reached(worker: ServeProcess) -> dict[str, pb.TaskPhase]:
    """Waits until each slow task is in the phase it is meant to be caught in."""
    while True:
        reached = {}
        for task_id in PHASES:
            request = pb.GetTaskResultRequest(task_id=task_id)
            reply = await worker.call(worker.stub.get_task_result, request)
            assert isinstance(reply, pb.GetTaskResultResponse)
            reached[task_id] = reply.phase
        if reached == PHASES:
            return reached
        await trio.sleep(0.05)
