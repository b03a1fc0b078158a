"""A task's IO scope in a running worker: opened at activation, closed on every path."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest
import trio
import trio_asyncio

from blockx._proto.blockx.worker import v1 as pb
from blockx.calls import CallSpec
from blockx.io import IOScopeError, IOSystem, TaskIOScope
from blockx.phases import builders
from blockx.phases.builders import BuilderFailed, BuildRequest, call_list_calls
from tests.adapters.worker_harness import (
    Harness,
    call_list_task,
    running_worker,
    virtual_clock_config,
    worker_config,
)


class _ScopedCallList:
    """call_list that first connects to a SQLite file through the task's IO scope (a
    builder doing IO: it runs in a task actor), and fails when the task's label says so."""

    name = "call_list"
    usage = "call_list, reading through the task's IO scope"

    def __init__(self, database: Path) -> None:
        self.database = str(database)
        self.scopes: dict[str, TaskIOScope] = {}
        self.connections: dict[str, sqlite3.Connection] = {}

    async def build(self, request: BuildRequest) -> list[CallSpec]:
        assert request.io is not None
        self.scopes[request.task_id] = request.io
        connection = await request.io.connect("sqlite", self.database)
        self.connections[request.task_id] = connection
        assert await trio.to_thread.run_sync(lambda: connection.execute("select 1").fetchone())
        if request.labels.get("build") == "fail":
            raise BuilderFailed(message="the source says no")
        return call_list_calls(request)


@pytest.fixture
def scoped(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> _ScopedCallList:
    builder = _ScopedCallList(tmp_path / "source.db")
    monkeypatch.setitem(builders._FACTORIES, "call_list", lambda: builder)
    return builder


async def terminal(worker: Harness, task_id: str) -> pb.TaskResult:
    """The task's terminal result, read from a watch (which ends once it is sent)."""
    results: list[pb.TaskResult] = []
    stream = worker.stub.watch_tasks(pb.WatchTasksRequest(task_ids=[task_id]))
    async for update in trio_asyncio.aio_as_trio(stream):
        if update.is_terminal and update.result is not None:
            results.append(update.result)
    [result] = results
    return result


async def assert_closed(builder: _ScopedCallList, task_id: str) -> None:
    scope = builder.scopes[task_id]
    with trio.fail_after(10):  # closed off the slot table, on a worker thread
        await scope.all_closed.wait()
    assert scope.closed
    assert scope.connections == 0
    with pytest.raises(sqlite3.ProgrammingError, match="closed"):
        builder.connections[task_id].execute("select 1")


CASES: dict[str, tuple[dict[str, Any], tuple[int, str]]] = {
    "succeeded": (
        {"calls": [("demo.add", [1, 2])]},
        (pb.TaskState.SUCCEEDED, ""),
    ),
    "call_raised": (
        {"calls": [("demo.fail", [])]},
        (pb.TaskState.FAILED, "CALL_RAISED"),
    ),
    "builder_failed": (
        {"calls": [("demo.add", [1, 2])], "labels": {"build": "fail"}},
        (pb.TaskState.FAILED, "BUILDER_FAILED"),
    ),
    "plugin_failed": (
        {
            "calls": [("demo.add", [10, 20])],
            "result_handler": pb.ResultHandler(type="result", config_json='{"max_bytes": 1}'),
        },
        (pb.TaskState.FAILED, "OUTPUTS_TOO_LARGE"),
    ),
    "timed_out": (
        {"calls": [("demo.hang", [])], "task_timeout_ms": 300},
        (pb.TaskState.FAILED, "TIMED_OUT"),
    ),
}


@pytest.mark.parametrize("case", list(CASES))
async def test_the_io_scope_is_closed_however_the_task_ends(
    scoped: _ScopedCallList, case: str
) -> None:
    fields, expected = CASES[case]
    task = call_list_task(case, *fields.pop("calls"), **fields)
    async with running_worker() as worker:
        await worker.call(worker.stub.submit_task, pb.SubmitTaskRequest(task=task))
        result = await terminal(worker, case)
        assert (result.state, result.failure_code) == expected
        await assert_closed(scoped, case)


async def test_the_io_scope_is_closed_when_a_drain_ends_the_task(
    scoped: _ScopedCallList,
) -> None:
    config = worker_config(drainTimeoutMs=200)
    async with running_worker(config) as worker:
        task = call_list_task("drained", ("demo.hang", []))
        await worker.call(worker.stub.submit_task, pb.SubmitTaskRequest(task=task))
        await worker.calls.hanging.wait()
        worker.stop.set()  # the drain's deadline ends the hanging task
        await assert_closed(scoped, "drained")


async def test_a_task_whose_io_scope_cannot_open_fails_before_any_phase(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def refuse(system: IOSystem, task_id: str) -> TaskIOScope:
        raise IOScopeError(f"no scope for {task_id} today")

    monkeypatch.setattr(IOSystem, "open_scope", refuse)
    async with running_worker() as worker:
        task = call_list_task("refused", ("demo.add", [1, 2]))
        await worker.call(worker.stub.submit_task, pb.SubmitTaskRequest(task=task))
        result = await terminal(worker, "refused")
        assert worker.calls.started == []
    assert (result.state, result.phase, result.failure_code, result.retryable) == (
        pb.TaskState.FAILED,
        pb.TaskPhase.PREPARING,
        "IO_SCOPE_FAILED",
        True,
    )
    assert result.message == "cannot open the task's IO scope: no scope for refused today"


class _StuckCallList:
    """call_list whose tasks labelled `stuck` wait on a source that never answers, on a
    worker thread (as a blocking driver does)."""

    name = "call_list"
    usage = "call_list, stuck on IO when labelled so"

    def __init__(self) -> None:
        self.release = threading.Event()

    async def build(self, request: BuildRequest) -> list[CallSpec]:
        if request.labels.get("stuck") == "yes":
            await trio.to_thread.run_sync(self.release.wait, abandon_on_cancel=True)
        return call_list_calls(request)


async def test_a_builder_stuck_on_io_times_out_and_never_stalls_other_tasks(
    monkeypatch: pytest.MonkeyPatch, mock_clock: trio.testing.MockClock
) -> None:
    builder = _StuckCallList()
    monkeypatch.setitem(builders._FACTORIES, "call_list", lambda: builder)
    config = virtual_clock_config(phaseIoTimeoutMs=500)
    try:
        async with running_worker(config) as worker:
            stuck = call_list_task("stuck", ("demo.add", [1, 2]), labels={"stuck": "yes"})
            await worker.call(worker.stub.submit_task, pb.SubmitTaskRequest(task=stuck))
            for index in range(5):  # while the stuck builder waits, others run to the end
                task = call_list_task(f"free-{index}", ("demo.add", [index, 1]))
                await worker.call(worker.stub.submit_task, pb.SubmitTaskRequest(task=task))
                result = await terminal(worker, f"free-{index}")
                assert result.state == pb.TaskState.SUCCEEDED
            request = pb.GetTaskResultRequest(task_id="stuck")
            waiting = await worker.call(worker.stub.get_task_result, request)
            assert (waiting.state, waiting.phase) == (pb.TaskState.RUNNING, pb.TaskPhase.BUILDER)
            mock_clock.jump(0.6)  # past phaseIoTimeoutMs: virtual time only moves here
            result = await terminal(worker, "stuck")
    finally:
        builder.release.set()  # the abandoned thread may end
    assert (result.state, result.phase, result.failure_code, result.retryable) == (
        pb.TaskState.FAILED,
        pb.TaskPhase.BUILDER,
        "PHASE_IO_TIMEOUT",
        True,
    )
    assert result.message == "builder 'call_list' took longer than phaseIoTimeoutMs (500)"
    assert worker.calls.started == [f"free-{index}" for index in range(5)]
