"""Streaming build in a running worker: calls run while the builder reads, with back-pressure."""

from __future__ import annotations

import json
import threading
from collections.abc import AsyncIterator

import pytest
import trio

from blockx._proto.blockx.worker import v1 as pb
from blockx.calls import CallSpec, encode_args
from blockx.phases import builders
from blockx.phases.builders import BuilderFailed, BuildRequest, collect
from tests.adapters.test_io_worker import terminal
from tests.adapters.worker_harness import (
    FakeExecutors,
    Harness,
    running_worker,
    virtual_clock_config,
    worker_config,
)


class _Scan:
    """A streaming builder over a made-up source: `batches` batches of `per` calls of
    `function` (labels), call i returning i + 1 with demo.add. `fail_at` fails that
    batch's read; `stuck_at` never answers it (a blocking driver on a worker thread);
    `wait_for_calls` holds the second read until the task's first call has started."""

    name = "dbscan"
    usage = "a made-up scan"

    def __init__(self) -> None:
        self.executors: FakeExecutors | None = None
        self.read: dict[str, int] = {}
        self.finished: dict[str, bool] = {}
        self.started_before_end: dict[str, bool] = {}
        self.release = threading.Event()

    async def build(self, request: BuildRequest) -> list[CallSpec]:
        return await collect(self.stream(request))

    async def stream(self, request: BuildRequest) -> AsyncIterator[list[CallSpec]]:
        labels = request.labels
        task_id = request.task_id
        self.read[task_id] = 0
        try:
            for batch in range(int(labels.get("batches", "3"))):
                if labels.get("fail_at") == str(batch):
                    raise BuilderFailed(message=f"the source broke at batch {batch}")
                if labels.get("stuck_at") == str(batch):
                    await trio.to_thread.run_sync(self.release.wait, abandon_on_cancel=True)
                if batch == 1 and labels.get("wait_for_calls") and self.executors is not None:
                    with trio.fail_after(10):
                        await self.executors.run_started(task_id).wait()
                    self.started_before_end[task_id] = True
                self.read[task_id] += 1
                per = int(labels.get("per", "2"))
                yield [
                    CallSpec(
                        call_id=str(batch * per + i),
                        function=labels.get("function", "demo.add"),
                        args=encode_args([batch * per + i, 1]),
                    )
                    for i in range(per)
                ]
            self.finished[task_id] = True
        finally:
            self.finished.setdefault(task_id, False)


@pytest.fixture
def scan(monkeypatch: pytest.MonkeyPatch) -> _Scan:
    builder = _Scan()
    monkeypatch.setitem(builders._FACTORIES, "dbscan", lambda: builder)
    return builder


def scan_task(task_id: str, **labels: str) -> pb.TaskSpec:
    return pb.TaskSpec(
        task_id=task_id,
        function_call=pb.FunctionCallConfig(type="dbscan"),
        result_handler=pb.ResultHandler(type="result"),
        labels=labels,
    )


async def submit(worker: Harness, task: pb.TaskSpec) -> None:
    await worker.call(worker.stub.submit_task, pb.SubmitTaskRequest(task=task))


STREAMING = worker_config(**{"streamBuild.enabled": True})


async def test_calls_start_before_the_scan_ends_and_outputs_keep_call_order(scan: _Scan) -> None:
    async with running_worker(STREAMING) as worker:
        scan.executors = worker.calls
        await submit(worker, scan_task("s", batches="4", per="3", wait_for_calls="yes"))
        result = await terminal(worker, "s")
    assert (result.state, result.failure_code) == (pb.TaskState.SUCCEEDED, "")
    assert scan.started_before_end == {"s": True}
    assert json.loads(result.outputs_json) == list(range(1, 13))
    assert result.call_stats is not None
    assert (result.call_stats.calls_total, result.call_stats.calls_succeeded) == (12, 12)


async def test_without_stream_build_the_same_builder_builds_every_call_first(scan: _Scan) -> None:
    async with running_worker() as worker:
        scan.executors = worker.calls
        await submit(worker, scan_task("s", batches="4", per="3"))
        result = await terminal(worker, "s")
    assert result.state == pb.TaskState.SUCCEEDED
    assert json.loads(result.outputs_json) == list(range(1, 13))


async def test_a_scan_waits_while_its_calls_in_flight_reach_pending_calls(scan: _Scan) -> None:
    config = worker_config(
        drainTimeoutMs=200, **{"streamBuild.enabled": True, "streamBuild.pendingCalls": 4}
    )
    async with running_worker(config) as worker:
        await submit(worker, scan_task("s", batches="1000", per="1", function="demo.hang"))
        await worker.calls.hanging.wait()
        await trio.testing.wait_all_tasks_blocked()
        # 4 calls in flight; the read after the 4th waits for room (one batch ahead at most).
        assert scan.read["s"] == 4
        status = await worker.call(
            worker.stub.get_task_result, pb.GetTaskResultRequest(task_id="s")
        )
        assert (status.state, status.phase) == (pb.TaskState.RUNNING, pb.TaskPhase.CALLS)
        worker.stop.set()  # the drain's deadline ends it
    assert scan.finished == {"s": False}  # the stream was closed, unfinished


async def test_a_read_that_fails_mid_scan_fails_the_call_phase_naming_why(scan: _Scan) -> None:
    async with running_worker(STREAMING) as worker:
        await submit(worker, scan_task("s", batches="5", fail_at="2"))
        result = await terminal(worker, "s")
        healthy = scan_task("after", batches="2")
        await submit(worker, healthy)
        after = await terminal(worker, "after")
    assert (result.state, result.phase, result.failure_code, result.retryable) == (
        pb.TaskState.FAILED,
        pb.TaskPhase.CALLS,
        "BUILDER_FAILED",
        False,
    )
    assert result.message == "the source broke at batch 2"
    assert after.state == pb.TaskState.SUCCEEDED


async def test_a_config_the_builder_refuses_fails_in_the_builder_phase(scan: _Scan) -> None:
    async with running_worker(STREAMING) as worker:
        await submit(worker, scan_task("s", fail_at="0"))
        result = await terminal(worker, "s")
    assert (result.state, result.phase, result.failure_code) == (
        pb.TaskState.FAILED,
        pb.TaskPhase.BUILDER,
        "BUILDER_FAILED",
    )
    assert worker.calls.started == []


async def test_a_read_stuck_mid_scan_times_out_and_never_stalls_other_tasks(
    scan: _Scan, mock_clock: trio.testing.MockClock
) -> None:
    config = virtual_clock_config(**{"streamBuild.enabled": True, "phaseIoTimeoutMs": 500})
    try:
        async with running_worker(config) as worker:
            await submit(worker, scan_task("stuck", batches="3", stuck_at="1"))
            for index in range(3):  # meanwhile other streamed tasks run to the end
                await submit(worker, scan_task(f"free-{index}", batches="2"))
                free = await terminal(worker, f"free-{index}")
                assert free.state == pb.TaskState.SUCCEEDED
            mock_clock.jump(0.6)  # past phaseIoTimeoutMs: virtual time only moves here
            result = await terminal(worker, "stuck")
    finally:
        scan.release.set()
    assert (result.state, result.phase, result.failure_code, result.retryable) == (
        pb.TaskState.FAILED,
        pb.TaskPhase.CALLS,
        "PHASE_IO_TIMEOUT",
        True,
    )
    assert result.message == (
        "builder 'dbscan' took longer than phaseIoTimeoutMs (500) to read its next calls"
    )


async def test_scan_admission_runs_at_most_scan_slots_streamed_call_phases(
    scan: _Scan, mock_clock: trio.testing.MockClock
) -> None:
    config = virtual_clock_config(**{"streamBuild.enabled": True, "admission.scanSlots": 1})
    async with running_worker(config) as worker:
        first = scan_task("first", batches="1", per="1", function="demo.hang")
        first.task_timeout_ms = 1000
        await submit(worker, first)
        await worker.calls.hanging.wait()
        await submit(worker, scan_task("second", batches="1", per="1"))
        await trio.testing.wait_all_tasks_blocked()
        assert worker.calls.started == ["first"]  # the second waits for scan admission
        # An ordinary task takes executor admission, not scan admission: it runs now.
        plain = pb.TaskSpec(
            task_id="plain",
            function_call=pb.FunctionCallConfig(type="call_list"),
            payload=b'[{"function": "demo.add", "args": [1, 2]}]',
        )
        await submit(worker, plain)
        assert (await terminal(worker, "plain")).state == pb.TaskState.SUCCEEDED
        assert "second" not in worker.calls.started
        mock_clock.jump(1.1)  # the first times out and gives its scan admission up
        assert (await terminal(worker, "first")).failure_code == "TIMED_OUT"
        assert (await terminal(worker, "second")).state == pb.TaskState.SUCCEEDED
    assert worker.calls.started == ["first", "plain", "second"]
