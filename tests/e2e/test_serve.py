"""`python -m blockx serve` as a real process, with real executors and clients elsewhere."""

from __future__ import annotations

import datetime
import itertools
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio
import trio_asyncio

from blockx._proto.blockx.worker import v1 as pb
from tests.e2e.processes import alive, wait_exited
from tests.e2e.serve_process import REPO, runtime_dir_config, serve_process


def call_list(task_id: str, calls: list[tuple[str, list[object]]], **fields: object) -> pb.TaskSpec:
    payload = {"calls": [{"function": f, "args": a} for f, a in calls]}
    return pb.TaskSpec(
        task_id=task_id,
        function_call=pb.FunctionCallConfig(type="call_list"),
        payload=json.dumps(payload).encode(),
        **fields,  # type: ignore[arg-type]
    )


async def test_example_tasks_succeed_fail_and_time_out_with_their_codes(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    async with serve_process("--executors", "2", "--slots", "8") as worker:
        ok = call_list(
            "ok",
            [("demo.add", [1, 2]), ("text.shout", ["hi"])],
            result_handler=pb.ResultHandler(
                type="jsonl", config_json=json.dumps({"path": str(out)})
            ),
        )
        failing = call_list("bad", [("demo.fail", ["no luck"])])
        slow = call_list("slow", [("demo.sleep", [30])], task_timeout_ms=1_000)
        for task in (ok, failing, slow):
            reply = await worker.call(worker.stub.submit_task, pb.SubmitTaskRequest(task=task))
            assert reply.state == pb.TaskState.RUNNING  # type: ignore[attr-defined]
        updates = await worker.watch("ok", "bad", "slow")
        results = {u.task_id: u.result for u in updates if u.is_terminal}

        assert results["ok"] is not None
        assert results["ok"].state == pb.TaskState.SUCCEEDED
        lines = [json.loads(line) for line in out.read_text().splitlines()]
        assert [line["value"] for line in lines] == [3, "HI!"]
        assert results["ok"].execute_result is not None
        assert results["ok"].execute_result.plugin_results[0].records_written == 2

        assert results["bad"] is not None
        assert (results["bad"].state, results["bad"].failure_code) == (
            pb.TaskState.FAILED,
            "CALL_RAISED",
        )
        assert "no luck" in results["bad"].message

        assert results["slow"] is not None
        assert (results["slow"].failure_code, results["slow"].retryable) == ("TIMED_OUT", True)


async def test_the_cli_submits_and_follows_a_task_from_another_process() -> None:
    async with serve_process("--executors", "2") as worker:
        command = [
            sys.executable, "-m", "blockx", "submit",
            "--worker", f"127.0.0.1:{worker.port}",
            "--task-id", "cli-1",
            "--builder", "call_list",
            "--payload", json.dumps({"calls": [{"function": "demo.add", "args": [20, 22]}]}),
            "--plugin", "test",
            "--watch",
        ]  # fmt: skip
        done = await trio.run_process(command, capture_stdout=True, capture_stderr=True, cwd=REPO)
        result = json.loads(done.stdout)
        assert result["state"] == "TASK_STATE_SUCCEEDED" or result["state"] == "SUCCEEDED"
        assert result["taskId"] == "cli-1"

        failing = [*command[:7], "cli-2", *command[8:]]
        failing[failing.index("--payload") + 1] = json.dumps(
            {"calls": [{"function": "demo.fail", "args": ["x"]}]}
        )
        done = await trio.run_process(
            failing, capture_stdout=True, capture_stderr=True, cwd=REPO, check=False
        )
        assert done.returncode == 1
        assert b"CALL_RAISED" in done.stderr


async def test_the_cli_prints_the_values_of_a_static_task_kept_by_the_result_plugin() -> None:
    async with serve_process("--executors", "2") as worker:
        address = f"127.0.0.1:{worker.port}"
        submit = [
            sys.executable, "-m", "blockx", "submit", "--worker", address,
            "--task-id", "values-1",
            "--builder", "static",
            "--config", json.dumps({"function": "text.shout", "args": ["hello"], "count": 2}),
            "--plugin", "result",
            "--watch",
        ]  # fmt: skip
        done = await trio.run_process(submit, capture_stdout=True, capture_stderr=True, cwd=REPO)
        followed = json.loads(done.stdout)
        result = [sys.executable, "-m", "blockx", "result", "values-1", "--worker", address]
        done = await trio.run_process(result, capture_stdout=True, capture_stderr=True, cwd=REPO)
        retained = json.loads(done.stdout)["result"]

    assert followed["state"] == "TASK_STATE_SUCCEEDED"
    assert followed["outputs"] == ["HELLO!", "HELLO!"]
    assert retained == followed


async def test_sigterm_ends_every_task_terminal_for_its_watchers_and_leaves_no_executor() -> None:
    async with serve_process(
        "--executors", "2", "--slots", "4", env={"DRAIN_TIMEOUT_MS": "1500"}
    ) as worker:
        status = await worker.call(worker.stub.get_worker_status, pb.GetWorkerStatusRequest())
        pids = [e.pid for e in status.executors]  # type: ignore[attr-defined]
        assert len(pids) == 2
        assert all(alive(pid) for pid in pids)
        quick = call_list("quick", [("demo.sleep", [0.5])])
        stuck = call_list("stuck", [("demo.sleep", [60])])
        for task in (quick, stuck):
            await worker.call(worker.stub.submit_task, pb.SubmitTaskRequest(task=task))
        seen: list[pb.TaskUpdate] = []
        attached = trio.Event()

        async def follow() -> None:
            seen.extend(await worker.watch("quick", "stuck", attached=attached))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(follow)
            await attached.wait()
            worker.process.send_signal(signal.SIGTERM)
        results = {u.task_id: u.result for u in seen if u.is_terminal}
        assert results["quick"] is not None
        assert results["quick"].state == pb.TaskState.SUCCEEDED  # finished within the drain
        assert results["stuck"] is not None
        assert (results["stuck"].failure_code, results["stuck"].retryable) == (
            "WORKER_SHUTDOWN",
            True,
        )
        with trio.fail_after(30):
            code = await worker.process.wait()
        assert code == 0, "\n".join(worker.log)
        assert not any(alive(pid) for pid in pids)


def test_serve_refuses_bad_configuration_with_the_field_named() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "blockx", "serve", "--slots", "0"],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=False,
        timeout=60,
    )
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        "blockx: error: worker.taskSlots = 0 (from --slots): must be > 0"
    ]


async def test_a_second_signal_exits_at_once_leaving_no_executor_and_no_runtime_dir(
    tmp_path: Path,
) -> None:
    config, runtime_parent = runtime_dir_config(tmp_path)
    env = {"DRAIN_TIMEOUT_MS": "60000", "WORKER_CONFIG": str(config)}
    async with serve_process("--executors", "2", env=env) as worker:
        assert len(list(runtime_parent.iterdir())) == 1  # the executors' socket directory
        status = await worker.call(worker.stub.get_worker_status, pb.GetWorkerStatusRequest())
        pids = [e.pid for e in status.executors]  # type: ignore[attr-defined]
        stuck = call_list("stuck", [("demo.sleep", [60])])
        await worker.call(worker.stub.submit_task, pb.SubmitTaskRequest(task=stuck))
        worker.process.send_signal(signal.SIGTERM)
        with trio.fail_after(30):
            await worker.wait_for_line("shutting down")
            # Another signal than the first: a second request, however soon it comes.
            worker.process.send_signal(signal.SIGINT)
            code = await worker.process.wait()
        assert code == 128 + signal.SIGINT
        assert any("exiting at once" in line for line in worker.log)
        assert list(runtime_parent.iterdir()) == []
        with trio.fail_after(10):  # executors exit on their closed sockets
            for pid in pids:
                await wait_exited(pid)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
async def test_a_group_signal_under_uv_run_drains_and_executors_finish_their_calls(
    signum: signal.Signals,
) -> None:
    """A process manager (systemd by default) signals the whole group: `uv run`, the
    worker and its executors. The worker sees the signal once or twice (`uv run`
    forwards it) and drains once; the executors ignore it and finish their calls."""
    env = {"DRAIN_TIMEOUT_MS": "30000"}
    async with serve_process("--executors", "1", env=env, under_uv=True) as worker:
        status = await worker.call(worker.stub.get_worker_status, pb.GetWorkerStatusRequest())
        pids = [e.pid for e in status.executors]  # type: ignore[attr-defined]
        slow = call_list("slow", [("demo.sleep", [1.5])])
        await worker.call(worker.stub.submit_task, pb.SubmitTaskRequest(task=slow))
        seen: list[pb.TaskUpdate] = []
        calling = trio.Event()

        async def follow() -> None:
            stream = worker.stub.watch_tasks(pb.WatchTasksRequest(task_ids=["slow"]))
            async for update in trio_asyncio.aio_as_trio(stream):
                seen.append(update)
                if update.phase == pb.TaskPhase.CALLS:
                    calling.set()

        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(follow)
                await calling.wait()
                os.killpg(worker.process.pid, signum)
            code = await worker.process.wait()
            await worker.wait_for_line("worker stopped")
        result = seen[-1].result
        assert result is not None
        assert result.state == pb.TaskState.SUCCEEDED, result
        assert result.call_stats is not None
        assert result.call_stats.calls_retried == 0, result  # its executor was never lost
        assert code == 0, "\n".join(worker.log)
        assert sum("shutting down" in line for line in worker.log) == 1, worker.log
        assert not any("exiting at once" in line for line in worker.log), worker.log
        with trio.fail_after(10):
            for pid in pids:
                await wait_exited(pid)


async def test_the_worker_runs_a_full_garbage_collection_on_a_clock() -> None:
    # Without it the oldest generation came round once in hours under load, and the
    # cycles that reached it grew the worker's RSS for as long (bench/soak.py found it).
    env = {"GC_COLLECT_INTERVAL_MS": "200"}
    async with serve_process("--executors", "1", env=env) as worker:
        with trio.fail_after(30):
            while len(collections := garbage_collections(worker.log)) < 3:
                await worker.logged.wait()
    times = [datetime.datetime.fromisoformat(line["ts"]) for line in collections]
    assert all(
        later - earlier >= datetime.timedelta(milliseconds=190)
        for earlier, later in itertools.pairwise(times)
    )
    for line in collections:
        assert line["level"] == "INFO"
        assert line["gc_unreachable"] >= 0
        assert 0 <= line["gc_pause_ms"] < 1000


def garbage_collections(log: list[str]) -> list[dict[str, Any]]:
    """The worker's log lines of its full garbage collections, parsed."""
    lines = [json.loads(line) for line in log if line.startswith("{")]
    return [line for line in lines if line["msg"].startswith("garbage collection: ")]
