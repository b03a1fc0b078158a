"""The worker client, and the CLI's client commands, against an in-process fake worker.

The fake is a `WorkerServiceBase` with canned answers keyed by task id, served
by grpclib on trio-asyncio's loop at 127.0.0.1 port 0. Its handlers are
asyncio code (they run on the loop), which is why this module imports asyncio.
CLI commands run `blockx.cli.main` in a worker thread, where it makes its own
`trio.run`. Every test runs under `fail_after`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import cast

import pytest
import trio
import trio_asyncio
from grpclib.const import Status
from grpclib.exceptions import GRPCError
from grpclib.server import Server

from blockx import cli
from blockx._proto.blockx.worker import v1 as pb
from blockx.client import (
    TaskOutcome,
    WatchEndedEarly,
    WorkerCallError,
    WorkerClient,
    task_outputs,
    task_spec,
)
from blockx.errors import BlockxError

FAIL_AFTER_S = 10
ACCEPTED_AT_MS = 1_700_000_000_000
FINISHED_AT_MS = ACCEPTED_AT_MS + 1_500

RUNNING_PHASES = (pb.TaskPhase.PREPARING, pb.TaskPhase.CALLS)
"""The live updates the fake sends for an ordinary task before its terminal one."""


KEPT_OUTPUTS = {"valued": '[42,"HI!",{"$bytes":"AP8="},18446744073709551615]'}
"""The outputs the fake's result of a task id carries (the `result` plugin kept them)."""


def succeeded(task_id: str) -> pb.TaskResult:
    return pb.TaskResult(
        task_id=task_id,
        state=pb.TaskState.SUCCEEDED,
        phase=pb.TaskPhase.TERMINAL,
        call_stats=pb.CallStatistics(calls_total=2, calls_succeeded=2),
        accepted_at_ms=ACCEPTED_AT_MS,
        finished_at_ms=FINISHED_AT_MS,
        outputs_json=KEPT_OUTPUTS.get(task_id, ""),
    )


def shown_with_outputs(result: pb.TaskResult) -> dict[str, object]:
    """What the CLI prints of a result whose outputs were kept: `outputs` as JSON values."""
    shown = result.to_dict()
    del shown["outputsJson"]
    return shown | {"outputs": [42, "HI!", {"$bytes": "AP8="}, 2**64 - 1]}


def failed(task_id: str) -> pb.TaskResult:
    return pb.TaskResult(
        task_id=task_id,
        state=pb.TaskState.FAILED,
        phase=pb.TaskPhase.CALLS,
        failure_code="CALL_FAILED",
        message='boom\n  File "demo.py", line 2, in fail',
        accepted_at_ms=ACCEPTED_AT_MS,
        finished_at_ms=FINISHED_AT_MS,
    )


def live(task_id: str, phase: pb.TaskPhase) -> pb.TaskUpdate:
    return pb.TaskUpdate(task_id=task_id, state=pb.TaskState.RUNNING, phase=phase)


def terminal(result: pb.TaskResult) -> pb.TaskUpdate:
    return pb.TaskUpdate(
        task_id=result.task_id,
        state=result.state,
        phase=pb.TaskPhase.TERMINAL,
        is_terminal=True,
        result=result,
    )


STATUS = pb.GetWorkerStatusResponse(
    worker_addr="10.0.0.5:8081",
    deployment="block",
    version="0.1.0",
    started_at_ms=ACCEPTED_AT_MS,
    ready=True,
    draining=False,
    slots_total=3,
    reserved_slots=1,
    running_tasks=1,
    free_slots=1,
    retained_results=2,
    retained_bytes=3 * 1024 * 1024 // 2,
    slots=[
        pb.SlotStatus(slot_id="slot-0", state="RUNNING", task_id="t-run"),
        pb.SlotStatus(
            slot_id="slot-1",
            state="ALLOCATED",
            task_id="t-held",
            lease_expires_at_ms=ACCEPTED_AT_MS + 5_000,
        ),
        pb.SlotStatus(slot_id="slot-2", state="FREE"),
    ],
    executors=[
        pb.ExecutorStatus(
            executor_id="exec-0",
            state="READY",
            pid=4242,
            rss_bytes=50 * 1024 * 1024,
            calls_served=17,
            restarts=1,
        )
    ],
)


class FakeWorker(pb.WorkerServiceBase):
    """Canned answers by task id.

    RequestTaskSlot: "full" is RESOURCE_EXHAUSTED. SubmitTask: "done" already
    finished (the answer carries its result), "rejected" is INVALID_ARGUMENT.
    GetTaskResult: "missing" is NOT_FOUND, "vanishes" is still RUNNING.
    WatchTasks, per id in turn: "missing" is NOT_FOUND; "hang" sends PREPARING
    and then waits until cancelled; "vanishes" sends PREPARING and ends;
    "fails" ends FAILED; any other id runs PREPARING, CALLS, then SUCCEEDED
    (a result of "valued" carries kept outputs). RunTasks, per request:
    "missing" ends the stream NOT_FOUND; "vanishes" is accepted and never
    finished; any other id is accepted and finished SUCCEEDED at once.
    Must be made on the asyncio loop.
    """

    def __init__(self) -> None:
        self.submitted: list[pb.SubmitTaskRequest] = []
        self.watched: list[list[str]] = []
        self.watch_cancelled = asyncio.Event()

    async def request_task_slot(
        self, message: pb.RequestTaskSlotRequest
    ) -> pb.RequestTaskSlotResponse:
        if message.task_id == "full":
            raise GRPCError(Status.RESOURCE_EXHAUSTED, "all 3 task slots are in use")
        return pb.RequestTaskSlotResponse(
            task_id=message.task_id,
            slot_id="slot-1",
            state=pb.TaskState.ALLOCATED,
            phase=pb.TaskPhase.PREPARING,
            lease_expires_at_ms=ACCEPTED_AT_MS + message.ttl_ms,
        )

    async def submit_task(self, message: pb.SubmitTaskRequest) -> pb.SubmitTaskResponse:
        self.submitted.append(message)
        assert message.task is not None
        task_id = message.task.task_id
        if task_id == "rejected":
            raise GRPCError(Status.INVALID_ARGUMENT, "builder 'nope' is not known")
        if task_id == "done":
            return pb.SubmitTaskResponse(
                task_id=task_id,
                slot_id="slot-9",
                state=pb.TaskState.SUCCEEDED,
                phase=pb.TaskPhase.TERMINAL,
                result=succeeded(task_id),
            )
        return pb.SubmitTaskResponse(
            task_id=task_id,
            slot_id=message.slot_id or "slot-inline",
            state=pb.TaskState.RUNNING,
            phase=pb.TaskPhase.PREPARING,
        )

    async def get_task_result(self, message: pb.GetTaskResultRequest) -> pb.GetTaskResultResponse:
        task_id = message.task_id
        if task_id == "missing":
            raise GRPCError(Status.NOT_FOUND, "task missing is not known")
        if task_id == "vanishes":
            return pb.GetTaskResultResponse(
                task_id=task_id, state=pb.TaskState.RUNNING, phase=pb.TaskPhase.CALLS
            )
        return pb.GetTaskResultResponse(
            task_id=task_id,
            state=pb.TaskState.SUCCEEDED,
            phase=pb.TaskPhase.TERMINAL,
            result=succeeded(task_id),
        )

    async def watch_tasks(self, message: pb.WatchTasksRequest) -> AsyncIterator[pb.TaskUpdate]:
        self.watched.append(list(message.task_ids))
        for task_id in message.task_ids:
            if task_id == "missing":
                raise GRPCError(Status.NOT_FOUND, "task missing is not known")
            yield live(task_id, pb.TaskPhase.PREPARING)
            if task_id == "hang":
                try:
                    await asyncio.Event().wait()
                except asyncio.CancelledError:
                    self.watch_cancelled.set()
                    raise
            if task_id == "vanishes":
                return
            if task_id == "fails":
                yield terminal(failed(task_id))
                continue
            yield live(task_id, pb.TaskPhase.CALLS)
            yield terminal(succeeded(task_id))

    async def get_worker_status(
        self, message: pb.GetWorkerStatusRequest
    ) -> pb.GetWorkerStatusResponse:
        return STATUS

    async def run_tasks(
        self, messages: AsyncIterator[pb.RunTasksRequest]
    ) -> AsyncIterator[pb.RunTasksResponse]:
        async for message in messages:
            # A request's tasks: its single one first, then its items (a batch).
            tasks = [message.task] if message.task is not None else []
            tasks += [item.task for item in message.items if item.task is not None]
            assert tasks
            for task in tasks:
                task_id = task.task_id
                if task_id == "missing":
                    raise GRPCError(Status.NOT_FOUND, "task missing is not known")
                accepted = pb.SubmitTaskResponse(
                    task_id=task_id, slot_id="slot-1", state=pb.TaskState.RUNNING
                )
                yield pb.RunTasksResponse(events=[pb.RunTasksEvent(accepted=accepted)])
                if task_id != "vanishes":
                    finished = pb.RunTasksEvent(finished=terminal(succeeded(task_id)))
                    yield pb.RunTasksResponse(events=[finished])


async def _start_fake() -> tuple[FakeWorker, Server, int]:
    worker = FakeWorker()
    server = Server([worker])
    await server.start("127.0.0.1", 0)
    listener = cast("asyncio.Server", server._server)
    return worker, server, int(listener.sockets[0].getsockname()[1])


async def _stop_fake(server: Server) -> None:
    server.close()
    await server.wait_closed()


@contextlib.asynccontextmanager
async def fake_worker() -> AsyncIterator[tuple[FakeWorker, str]]:
    """Inside trio-asyncio's loop: the fake worker and its "host:port"."""
    async with trio_asyncio.open_loop():
        worker, server, port = await trio_asyncio.aio_as_trio(_start_fake)()
        try:
            yield worker, f"127.0.0.1:{port}"
        finally:
            with trio.CancelScope(shield=True):
                await trio_asyncio.aio_as_trio(_stop_fake)(server)


@contextlib.asynccontextmanager
async def connected() -> AsyncIterator[tuple[FakeWorker, WorkerClient]]:
    with trio.fail_after(FAIL_AFTER_S):
        async with fake_worker() as (worker, address), WorkerClient.connect(address) as client:
            yield worker, client


async def wait_aio(event: asyncio.Event) -> None:
    await trio_asyncio.aio_as_trio(event.wait)()


def spec(task_id: str) -> pb.TaskSpec:
    return task_spec(task_id, builder="call_list", config={"calls": []}, plugin="log")


def outline(updates: list[pb.TaskUpdate]) -> list[tuple[str, pb.TaskPhase, bool]]:
    return [(update.task_id, update.phase, update.is_terminal) for update in updates]


# --- unary calls ---------------------------------------------------------------------------


async def test_request_slot_returns_the_reservation() -> None:
    async with connected() as (_, client):
        response = await client.request_slot("t1", ttl_ms=2_000)
    assert response == pb.RequestTaskSlotResponse(
        task_id="t1",
        slot_id="slot-1",
        state=pb.TaskState.ALLOCATED,
        phase=pb.TaskPhase.PREPARING,
        lease_expires_at_ms=ACCEPTED_AT_MS + 2_000,
    )


async def test_request_slot_of_a_full_worker_is_resource_exhausted() -> None:
    async with connected() as (_, client):
        with pytest.raises(WorkerCallError) as excinfo:
            await client.request_slot("full")
    assert excinfo.value.rpc == "RequestTaskSlot"
    assert excinfo.value.status is Status.RESOURCE_EXHAUSTED


async def test_submit_sends_the_spec_and_slot_and_returns_the_snapshot() -> None:
    async with connected() as (worker, client):
        response = await client.submit(spec("t1"), slot_id="slot-1")
    assert response == pb.SubmitTaskResponse(
        task_id="t1", slot_id="slot-1", state=pb.TaskState.RUNNING, phase=pb.TaskPhase.PREPARING
    )
    assert worker.submitted == [pb.SubmitTaskRequest(task=spec("t1"), slot_id="slot-1")]


async def test_submit_refused_by_the_worker_is_a_call_error() -> None:
    async with connected() as (_, client):
        with pytest.raises(WorkerCallError) as excinfo:
            await client.submit(spec("rejected"))
    assert excinfo.value.status is Status.INVALID_ARGUMENT
    assert excinfo.value.message == "builder 'nope' is not known"


async def test_result_of_a_finished_task() -> None:
    async with connected() as (_, client):
        response = await client.result("t1")
    assert response == pb.GetTaskResultResponse(
        task_id="t1",
        state=pb.TaskState.SUCCEEDED,
        phase=pb.TaskPhase.TERMINAL,
        result=succeeded("t1"),
    )


async def test_not_found_is_a_call_error_with_status_and_message() -> None:
    async with connected() as (_, client):
        with pytest.raises(WorkerCallError) as excinfo:
            await client.result("missing")
    error = excinfo.value
    assert isinstance(error, BlockxError)
    assert error.rpc == "GetTaskResult"
    assert error.status is Status.NOT_FOUND
    assert error.message == "task missing is not known"
    assert str(error) == "GetTaskResult failed: NOT_FOUND: task missing is not known"
    assert isinstance(error.__cause__, GRPCError)


async def test_status_returns_the_workers_slots_and_executors() -> None:
    async with connected() as (_, client):
        assert await client.status() == STATUS


# --- watch and run_task --------------------------------------------------------------------


async def test_watch_yields_each_update_until_the_stream_ends() -> None:
    async with connected() as (worker, client):
        updates = [update async for update in client.watch(["t1", "fails"])]
    assert worker.watched == [["t1", "fails"]]
    assert outline(updates) == [
        ("t1", pb.TaskPhase.PREPARING, False),
        ("t1", pb.TaskPhase.CALLS, False),
        ("t1", pb.TaskPhase.TERMINAL, True),
        ("fails", pb.TaskPhase.PREPARING, False),
        ("fails", pb.TaskPhase.TERMINAL, True),
    ]
    assert updates[2].result == succeeded("t1")
    assert updates[4].result == failed("fails")


async def test_watch_of_an_unknown_task_is_not_found() -> None:
    async with connected() as (_, client):
        with pytest.raises(WorkerCallError) as excinfo:
            async for _ in client.watch(["missing"]):
                pass
    assert excinfo.value.rpc == "WatchTasks"
    assert excinfo.value.status is Status.NOT_FOUND


async def test_cancelling_the_watchers_nursery_mid_stream_resets_the_stream() -> None:
    received: list[pb.TaskUpdate] = []
    async with connected() as (worker, client):
        first_update = trio.Event()

        async def follow() -> None:
            async for update in client.watch(["hang"]):
                received.append(update)
                first_update.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(follow)
            await first_update.wait()
            nursery.cancel_scope.cancel()

        # The worker saw its watcher go away: the stream was reset, not leaked.
        await wait_aio(worker.watch_cancelled)
        assert await client.status() == STATUS
    assert outline(received) == [("hang", pb.TaskPhase.PREPARING, False)]


async def test_leaving_a_watch_early_with_aclosing_resets_the_stream() -> None:
    async with connected() as (worker, client):
        async with contextlib.aclosing(client.watch(["hang"])) as updates:
            async for update in updates:
                assert update.phase == pb.TaskPhase.PREPARING
                break
        await wait_aio(worker.watch_cancelled)
        assert (await client.result("t1")).state == pb.TaskState.SUCCEEDED


async def test_run_task_returns_the_terminal_result_and_reports_each_update() -> None:
    seen: list[pb.TaskUpdate] = []
    async with connected() as (worker, client):
        result = await client.run_task(spec("t1"), on_update=seen.append)
    assert result == succeeded("t1")
    assert outline(seen) == [
        ("t1", pb.TaskPhase.PREPARING, False),
        ("t1", pb.TaskPhase.CALLS, False),
        ("t1", pb.TaskPhase.TERMINAL, True),
    ]
    assert worker.submitted == [pb.SubmitTaskRequest(task=spec("t1"))]
    assert worker.watched == [["t1"]]


async def test_run_task_returns_the_kept_outputs_and_task_outputs_reads_them() -> None:
    async with connected() as (_, client):
        result = await client.run_task(spec("valued"))
        plain = await client.run_task(spec("t1"))
    assert result.outputs_json == KEPT_OUTPUTS["valued"]
    assert task_outputs(result) == [42, "HI!", {"$bytes": "AP8="}, 2**64 - 1]
    assert task_outputs(plain) is None


async def test_run_task_of_a_failing_task_returns_its_failed_result() -> None:
    async with connected() as (_, client):
        assert await client.run_task(spec("fails")) == failed("fails")


async def test_run_task_of_a_finished_task_returns_its_result_without_watching() -> None:
    async with connected() as (worker, client):
        result = await client.run_task(spec("done"))
    assert result == succeeded("done")
    assert worker.watched == []


async def test_run_task_whose_stream_ends_early_asks_for_the_result() -> None:
    async with connected() as (_, client):
        with pytest.raises(WatchEndedEarly) as excinfo:
            await client.run_task(spec("vanishes"))
    assert excinfo.value.task_ids == ("vanishes",)


async def read_all(
    run: contextlib.AbstractAsyncContextManager[trio.MemoryReceiveChannel[TaskOutcome]],
    into: list[TaskOutcome] | None = None,
) -> list[TaskOutcome]:
    ended = [] if into is None else into
    async with run as outcomes:
        async for outcome in outcomes:
            ended.append(outcome)
    return ended


async def test_run_tasks_whose_stream_ends_before_a_task_finished_raises_watch_ended_early() -> (
    None
):
    async with connected() as (_, client):
        ended: list[TaskOutcome] = []
        outcomes = client.run_tasks([spec("t1"), spec("vanishes")])
        with pytest.raises(WatchEndedEarly) as excinfo:
            await read_all(outcomes, into=ended)
    assert [outcome.task_id for outcome in ended] == ["t1"]
    assert ended[0].result == succeeded("t1")
    assert excinfo.value.task_ids == ("vanishes",)


async def test_run_tasks_ended_by_a_status_raises_a_call_error_from_the_grpc_error() -> None:
    async with connected() as (_, client):
        outcomes = client.run_tasks([spec("t1"), spec("missing")])
        with pytest.raises(WorkerCallError) as excinfo:
            await read_all(outcomes)
    error = excinfo.value
    assert (error.rpc, error.status) == ("RunTasks", Status.NOT_FOUND)
    assert isinstance(error.__cause__, GRPCError)


# --- the CLI's client commands -------------------------------------------------------------


async def run_cli(*argv: str) -> int:
    return await trio.to_thread.run_sync(cli.main, list(argv), abandon_on_cancel=True)


async def test_cli_submit_prints_the_submit_response(capsys: pytest.CaptureFixture[str]) -> None:
    async with connected() as (worker, client):
        status = await run_cli(
            "submit",
            "--worker",
            client.address,
            "--task-id",
            "t1",
            "--builder",
            "call_list",
            "--config",
            '{"calls": [1]}',
            "--payload",
            "hello",
            "--label",
            "team=core",
        )
    out = capsys.readouterr().out
    assert status == 0
    assert json.loads(out) == {
        "taskId": "t1",
        "slotId": "slot-inline",
        "state": "TASK_STATE_RUNNING",
        "phase": "TASK_PHASE_PREPARING",
    }
    [request] = worker.submitted
    assert request.task == task_spec(
        "t1",
        builder="call_list",
        config={"calls": [1]},
        payload=b"hello",
        labels={"team": "core"},
    )


@pytest.mark.parametrize(
    ("plugin_flag", "config_flag"),
    [("--plugin", "--plugin-config"), ("--writer", "--writer-config")],
)
async def test_cli_submit_sends_the_plugin_under_either_flag_spelling(
    plugin_flag: str, config_flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    async with connected() as (worker, client):
        status = await run_cli(
            "submit",
            "--worker",
            client.address,
            "--task-id",
            "t1",
            "--builder",
            "static",
            plugin_flag,
            "jsonl",
            config_flag,
            '{"path": "out.jsonl"}',
        )
    assert status == 0
    assert json.loads(capsys.readouterr().out)["taskId"] == "t1"
    [request] = worker.submitted
    assert request.task == task_spec(
        "t1", builder="static", plugin="jsonl", plugin_config={"path": "out.jsonl"}
    )


@pytest.mark.parametrize(
    ("plugin_key", "config_key"), [("plugin", "plugin_config"), ("writer", "writer_config")]
)
async def test_cli_submit_a_task_file_with_a_plugin_under_either_key(
    plugin_key: str, config_key: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    task_file = tmp_path / "task.json"
    document = {
        "task_id": "with-plugin",
        "builder": "static",
        plugin_key: "jsonl",
        config_key: {"path": "out.jsonl"},
    }
    task_file.write_text(json.dumps(document), encoding="utf-8")
    async with connected() as (worker, client):
        status = await run_cli("submit", "--worker", client.address, "--file", str(task_file))
    assert status == 0
    assert json.loads(capsys.readouterr().out)["taskId"] == "with-plugin"
    [request] = worker.submitted
    assert request.task == task_spec(
        "with-plugin", builder="static", plugin="jsonl", plugin_config={"path": "out.jsonl"}
    )


async def test_cli_submit_a_task_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    task_file = tmp_path / "task.json"
    task_file.write_text(
        json.dumps({"task_id": "from-file", "builder": "static", "payload": [1, 2]}),
        encoding="utf-8",
    )
    async with connected() as (worker, client):
        status = await run_cli("submit", "--worker", client.address, "--file", str(task_file))
    assert status == 0
    assert json.loads(capsys.readouterr().out)["taskId"] == "from-file"
    [request] = worker.submitted
    assert request.task == task_spec("from-file", builder="static", payload=b"[1,2]")


async def test_cli_submit_watch_shows_progress_and_prints_the_result(
    capsys: pytest.CaptureFixture[str],
) -> None:
    async with connected() as (_, client):
        status = await run_cli(
            "submit", "--worker", client.address, "--task-id", "t1", "--builder", "x", "--watch"
        )
    captured = capsys.readouterr()
    assert status == 0
    assert json.loads(captured.out) == succeeded("t1").to_dict()
    progress = [line.rsplit(" ", 1)[0] for line in captured.err.splitlines()]
    assert progress == ["task t1: PREPARING", "task t1: CALLS", "task t1: SUCCEEDED"]


async def test_cli_submit_watch_prints_the_kept_outputs_as_json_values(
    capsys: pytest.CaptureFixture[str],
) -> None:
    async with connected() as (_, client):
        status = await run_cli(
            "submit", "--worker", client.address, "--task-id", "valued", "--builder", "static",
            "--plugin", "result", "--watch",
        )  # fmt: skip
    captured = capsys.readouterr()
    assert status == 0
    assert json.loads(captured.out) == shown_with_outputs(succeeded("valued"))
    assert '"outputs": [\n    42,\n    "HI!",' in captured.out


async def test_cli_submit_watch_of_a_failing_task_exits_1(
    capsys: pytest.CaptureFixture[str],
) -> None:
    async with connected() as (_, client):
        status = await run_cli(
            "submit", "--worker", client.address, "--task-id", "fails", "--builder", "x", "--watch"
        )
    captured = capsys.readouterr()
    assert status == 1
    assert json.loads(captured.out) == failed("fails").to_dict()
    assert captured.err.splitlines()[-1] == "blockx: task fails failed: CALL_FAILED: boom"


async def test_cli_watch_prints_one_json_line_per_update(
    capsys: pytest.CaptureFixture[str],
) -> None:
    async with connected() as (_, client):
        status = await run_cli("watch", "t1", "t2", "--worker", client.address)
    lines = capsys.readouterr().out.splitlines()
    assert status == 0
    assert [json.loads(line) for line in lines] == [
        update.to_dict()
        for task_id in ("t1", "t2")
        for update in (
            *(live(task_id, phase) for phase in RUNNING_PHASES),
            terminal(succeeded(task_id)),
        )
    ]


async def test_cli_watch_exits_1_when_a_task_failed(capsys: pytest.CaptureFixture[str]) -> None:
    async with connected() as (_, client):
        status = await run_cli("watch", "t1", "fails", "--worker", client.address)
    captured = capsys.readouterr()
    assert status == 1
    assert len(captured.out.splitlines()) == 5
    assert captured.err == "blockx: task fails failed: CALL_FAILED: boom\n"


async def test_cli_result_prints_the_response(capsys: pytest.CaptureFixture[str]) -> None:
    async with connected() as (_, client):
        status = await run_cli("result", "t1", "--worker", client.address)
    assert status == 0
    assert json.loads(capsys.readouterr().out) == {
        "taskId": "t1",
        "state": "TASK_STATE_SUCCEEDED",
        "phase": "TASK_PHASE_TERMINAL",
        "result": succeeded("t1").to_dict(),
    }


async def test_cli_result_and_watch_print_the_kept_outputs_as_json_values(
    capsys: pytest.CaptureFixture[str],
) -> None:
    async with connected() as (_, client):
        result_status = await run_cli("result", "valued", "--worker", client.address)
        result_out = capsys.readouterr().out
        watch_status = await run_cli("watch", "valued", "--worker", client.address)
        watch_lines = capsys.readouterr().out.splitlines()
    assert (result_status, watch_status) == (0, 0)
    assert json.loads(result_out)["result"] == shown_with_outputs(succeeded("valued"))
    assert json.loads(watch_lines[-1])["result"] == shown_with_outputs(succeeded("valued"))


async def test_cli_result_of_an_unknown_task_exits_1_with_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    async with connected() as (_, client):
        status = await run_cli("result", "missing", "--worker", client.address)
    captured = capsys.readouterr()
    assert status == 1
    assert captured.out == ""
    assert captured.err == (
        "blockx: error: GetTaskResult failed: NOT_FOUND: task missing is not known\n"
    )


async def test_cli_status_prints_a_summary_and_tables(capsys: pytest.CaptureFixture[str]) -> None:
    async with connected() as (_, client):
        status = await run_cli("status", "--worker", client.address)
    assert status == 0
    assert capsys.readouterr().out.splitlines() == [
        "worker      10.0.0.5:8081",
        "deployment  block",
        "version     0.1.0",
        "started     2023-11-14T22:13:20.000Z",
        "ready       yes",
        "draining    no",
        "slots       3 total, 1 reserved, 1 running, 1 free",
        "results     2 retained, 1.5 MB",
        "",
        "slots in use:",
        "  SLOT    STATE      TASK    LEASE EXPIRES",
        "  slot-0  RUNNING    t-run   -",
        "  slot-1  ALLOCATED  t-held  2023-11-14T22:13:25.000Z",
        "",
        "executors:",
        "  ID      STATE  PID   RSS MB  CALLS SERVED  RESTARTS",
        "  exec-0  READY  4242  50.0    17            1",
    ]


async def test_cli_status_json_prints_the_raw_response(
    capsys: pytest.CaptureFixture[str],
) -> None:
    async with connected() as (_, client):
        status = await run_cli("status", "--json", "--worker", client.address)
    assert status == 0
    assert json.loads(capsys.readouterr().out) == STATUS.to_dict()
