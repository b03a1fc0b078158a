"""Faults around the fleet registry: etcd killed and restarted under a busy worker, and
the worker itself SIGKILLed.

etcd is only where coordinators find workers: while it is down the worker keeps
admitting and finishing tasks, and it registers again once etcd is back. A SIGKILLed
worker cannot clean up: its executors notice the lost connection and exit, and its
key vanishes when its lease runs out; a coordinator watching one of its tasks sees
the stream fail, never an invented result.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import trio
from grpclib.exceptions import GRPCError, StreamTerminatedError

from blockx._proto.blockx.worker import v1 as pb
from tests.e2e.etcd_server import etcd_server
from tests.e2e.processes import alive, wait_exited
from tests.e2e.serve_process import ServeProcess, serve_process
from tests.e2e.test_etcd import (
    EXPIRY_SLACK_S,
    SHORT_TTL_MS,
    etcd_client,
    heartbeat_at,
    key_deleted,
    key_of,
    worker_env,
)


def sleeper(task_id: str, seconds: float) -> pb.TaskSpec:
    payload = {"calls": [{"function": "demo.sleep", "args": [seconds]}]}
    return pb.TaskSpec(
        task_id=task_id,
        function_call=pb.FunctionCallConfig(type="call_list"),
        payload=json.dumps(payload).encode(),
    )


async def run(worker: ServeProcess, task: pb.TaskSpec) -> pb.TaskResult:
    await worker.call(worker.stub.submit_task, pb.SubmitTaskRequest(task=task))
    terminal = [update for update in await worker.watch(task.task_id) if update.is_terminal]
    assert len(terminal) == 1  # one terminal result, exactly
    assert terminal[0].result is not None
    return terminal[0].result


async def test_a_worker_serves_through_an_etcd_kill_and_registers_again(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with (
            etcd_server(tmp_path / "etcd") as etcd,
            serve_process("--executors", "2", env=worker_env(etcd)) as worker,
        ):
            async with etcd_client(etcd) as client:
                await heartbeat_at(client, key_of(worker))
            results: dict[str, pb.TaskResult] = {}

            async def spanning() -> None:  # runs across the outage
                results["spanning"] = await run(worker, sleeper("spanning", 1.0))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(spanning)
                assert etcd.process is not None
                etcd.process.kill()
                await etcd.stop()
                await worker.wait_for_line("cannot register " + key_of(worker))
                results["during"] = await run(worker, sleeper("during", 0))
            status = await worker.call(worker.stub.get_worker_status, pb.GetWorkerStatusRequest())
            await etcd.start()  # same data dir and ports
            async with etcd_client(etcd) as client:
                restarted_at = (await client.get_prefix("/")).revision
                beat = await heartbeat_at(client, key_of(worker), written_after=restarted_at)
            results["after"] = await run(worker, sleeper("after", 0))

    assert {task_id: r.state for task_id, r in results.items()} == {
        "spanning": pb.TaskState.SUCCEEDED,
        "during": pb.TaskState.SUCCEEDED,
        "after": pb.TaskState.SUCCEEDED,
    }
    assert isinstance(status, pb.GetWorkerStatusResponse)
    assert status.ready is True  # etcd is not the worker's health
    assert status.free_slots == status.slots_total
    assert beat.address == f"127.0.0.1:{worker.port}"


async def test_a_sigkilled_worker_leaves_no_executor_and_its_key_expires(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with etcd_server(tmp_path / "etcd") as etcd:
            env = worker_env(etcd, ETCD_LEASE_TTL_MS=str(SHORT_TTL_MS))
            async with (
                etcd_client(etcd) as client,
                serve_process("--executors", "2", env=env) as worker,
            ):
                await heartbeat_at(client, key_of(worker))
                status = await worker.call(
                    worker.stub.get_worker_status, pb.GetWorkerStatusRequest()
                )
                pids = [executor.pid for executor in status.executors]  # type: ignore[attr-defined]
                await worker.call(
                    worker.stub.submit_task, pb.SubmitTaskRequest(task=sleeper("mid", 30))
                )
                watched: list[pb.TaskUpdate] = []
                failure: list[BaseException] = []
                attached = trio.Event()

                async def watch() -> None:
                    try:
                        watched.extend(await worker.watch("mid", attached=attached))
                    except (GRPCError, StreamTerminatedError, ConnectionError) as error:
                        failure.append(error)

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(watch)
                    await attached.wait()
                    worker.process.send_signal(signal.SIGKILL)
                    await worker.process.wait()
                killed_at = trio.current_time()
                for pid in pids:
                    await wait_exited(pid)  # each executor saw its connection go, and left
                exited_after_s = trio.current_time() - killed_at
                with trio.fail_after(SHORT_TTL_MS / 1000 + EXPIRY_SLACK_S):
                    await key_deleted(client, key_of(worker))

    assert len(pids) == 2
    assert not any(alive(pid) for pid in pids)
    assert exited_after_s < 5
    assert failure, "the watch of a task on a killed worker must fail"
    assert not any(update.is_terminal for update in watched)  # no invented result
