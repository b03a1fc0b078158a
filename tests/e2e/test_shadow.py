"""Shadow submits between two real `python -m blockx serve` processes.

Both workers write the same JSONL path when they write at all, so the file
says who wrote: one line means only the primary did. The shadow target is
asked through a `WorkerClient` made while its own asyncio loop is current.
"""

from __future__ import annotations

import json
from pathlib import Path

import trio

from blockx._proto.blockx.worker import v1 as pb
from blockx.client import WorkerClient
from tests.e2e.serve_process import ServeProcess, free_port, serve_process
from tests.worker_results import result_once_there

NO_ETCD = {"ETCD_ENDPOINTS": "none"}
POLL_S = 0.05


def written_task(task_id: str, out: Path) -> pb.TaskSpec:
    payload = {"calls": [{"function": "demo.add", "args": [20, 22]}]}
    return pb.TaskSpec(
        task_id=task_id,
        function_call=pb.FunctionCallConfig(type="call_list"),
        payload=json.dumps(payload).encode(),
        result_handler=pb.ResultHandler(type="jsonl", config_json=json.dumps({"path": str(out)})),
    )


async def run_to_end(worker: ServeProcess, task: pb.TaskSpec) -> pb.TaskResult:
    reply = await worker.call(worker.stub.submit_task, pb.SubmitTaskRequest(task=task))
    assert reply.state == pb.TaskState.RUNNING  # type: ignore[attr-defined]
    updates = await worker.watch(task.task_id)
    final = updates[-1]
    assert final.is_terminal
    assert final.result is not None
    return final.result


def task_finished_lines(worker: ServeProcess, task_id: str) -> list[dict[str, object]]:
    lines = []
    for line in worker.log:
        try:
            parsed = json.loads(line)
        except json.JSONDecodeError:
            continue
        if parsed.get("msg") == "task_finished" and parsed.get("task_id") == task_id:
            lines.append(parsed)
    return lines


async def test_the_shadow_task_runs_on_the_second_worker_and_writes_nothing(
    tmp_path: Path,
) -> None:
    out = tmp_path / "out.jsonl"
    with trio.fail_after(90):
        async with (
            serve_process("--executors", "1", env=NO_ETCD) as target,
            WorkerClient.connect(f"127.0.0.1:{target.port}") as target_client,
        ):
            env = {
                **NO_ETCD,
                "SHADOW_SUBMIT_TARGET_ADDR": f"127.0.0.1:{target.port}",
                "SHADOW_SUBMIT_SAMPLE_RATE": "1",
            }
            async with serve_process("--executors", "1", env=env) as primary:
                result = await run_to_end(primary, written_task("e2e-shadow", out))
                assert result.state == pb.TaskState.SUCCEEDED

                shadow = await result_once_there(target_client, "e2e-shadow", poll_s=POLL_S)
                assert shadow.state == pb.TaskState.SUCCEEDED
                assert shadow.execute_result is not None
                assert shadow.execute_result.output_count == 1
                assert shadow.execute_result.plugin_results == []
                assert [json.loads(line)["value"] for line in out.read_text().splitlines()] == [42]

                await target.wait_for_line('"msg": "task_finished"')
                await primary.wait_for_line('"msg": "task_finished"')
                (finished,) = task_finished_lines(target, "e2e-shadow")
                assert finished["state"] == "SUCCEEDED"
                assert finished["calls_succeeded"] == 1
                (primary_finished,) = task_finished_lines(primary, "e2e-shadow")
                assert primary_finished["output_count"] == 1


async def test_the_primary_succeeds_when_the_shadow_target_is_down(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    env = {
        **NO_ETCD,
        "SHADOW_SUBMIT_TARGET_ADDR": f"127.0.0.1:{free_port()}",
        "SHADOW_SUBMIT_SAMPLE_RATE": "1",
    }
    with trio.fail_after(90):
        async with serve_process("--executors", "1", env=env) as primary:
            result = await run_to_end(primary, written_task("e2e-alone", out))
            assert result.state == pb.TaskState.SUCCEEDED
            assert [json.loads(line)["value"] for line in out.read_text().splitlines()] == [42]
            await primary.wait_for_line("shadow submits to")
            (warning,) = [line for line in primary.log if "shadow submits to" in line]
            assert json.loads(warning)["level"] == "WARNING"
