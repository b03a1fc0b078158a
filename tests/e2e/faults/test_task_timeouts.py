"""Fault: the task deadline passes during each phase.

A builder, a call and a plugin that would each take far longer than the task's
timeout: the task ends once, TIMED_OUT in the phase it was in, on time; the slow
work is cancelled (the builder and the plugin see the cancellation, the executor is
told to cancel the call); the slot is free and the worker goes on serving.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import trio
import trio.testing

from blockx._proto.blockx.worker import v1 as pb
from blockx.calls import CallSpec
from blockx.phases import builders
from blockx.phases.builders import BuildRequest
from tests.adapters.worker_harness import call_list_task, running_worker, virtual_clock_config

TIMEOUT_MS = 1_000
SLOW_S = 3_600


class _SlowBuilder:
    """`call_list`, but task "slow" waits an hour (virtual) first, noting cancellation."""

    name = "call_list"

    def __init__(self) -> None:
        self.cancelled: list[str] = []
        self._real = builders._FACTORIES["call_list"]()

    async def build(self, request: BuildRequest) -> list[CallSpec]:
        if request.task_id == "slow":
            try:
                await trio.sleep(SLOW_S)
            except trio.Cancelled:
                self.cancelled.append(request.task_id)
                raise
        return await self._real.build(request)


def slow_builder_task() -> pb.TaskSpec:
    return call_list_task("slow", ("demo.add", [1, 2]), task_timeout_ms=TIMEOUT_MS)


def hanging_call_task() -> pb.TaskSpec:
    return call_list_task("slow", ("demo.hang", []), task_timeout_ms=TIMEOUT_MS)


def slow_plugin_task() -> pb.TaskSpec:
    handler = pb.ResultHandler(type="test", config_json=f'{{"delay_ms": {SLOW_S * 1000}}}')
    return call_list_task(
        "slow", ("demo.add", [1, 2]), task_timeout_ms=TIMEOUT_MS, result_handler=handler
    )


@pytest.mark.parametrize(
    ("make", "phase"),
    [
        (slow_builder_task, pb.TaskPhase.BUILDER),
        (hanging_call_task, pb.TaskPhase.CALLS),
        (slow_plugin_task, pb.TaskPhase.PLUGIN),
    ],
    ids=["builder", "calls", "plugin"],
)
async def test_the_task_deadline_ends_each_phase_once_and_on_time(
    autojump_clock: trio.testing.MockClock,
    monkeypatch: pytest.MonkeyPatch,
    make: Callable[[], pb.TaskSpec],
    phase: pb.TaskPhase,
) -> None:
    builder = _SlowBuilder()
    if phase == pb.TaskPhase.BUILDER:
        monkeypatch.setitem(builders._FACTORIES, "call_list", lambda: builder)
    # Phase IO timeouts far beyond the task's: the task deadline is what ends it.
    config = virtual_clock_config(phaseIoTimeoutMs=SLOW_S * 2_000)
    async with running_worker(config) as worker:
        started = trio.current_time()
        await worker.call(worker.stub.submit_task, pb.SubmitTaskRequest(task=make()))
        updates = await worker.watch("slow")
        ended_after_s = trio.current_time() - started
        status = await worker.call(worker.stub.get_worker_status, pb.GetWorkerStatusRequest())
        after = call_list_task("after", ("demo.add", [2, 2]))
        await worker.call(worker.stub.submit_task, pb.SubmitTaskRequest(task=after))
        served = [u for u in await worker.watch("after") if u.is_terminal]
        cancelled_calls = list(worker.calls.cancelled)

    terminal = [update for update in updates if update.is_terminal]
    assert len(terminal) == 1  # one terminal result, exactly
    result = terminal[0].result
    assert result is not None
    assert (result.state, result.failure_code, result.phase) == (
        pb.TaskState.FAILED,
        "TIMED_OUT",
        phase,
    )
    assert TIMEOUT_MS / 1000 <= ended_after_s < TIMEOUT_MS / 1000 + 0.5
    assert status.free_slots == status.slots_total  # no slot stays taken
    assert served[0].result is not None
    assert served[0].result.state == pb.TaskState.SUCCEEDED
    if phase == pb.TaskPhase.BUILDER:
        assert builder.cancelled == ["slow"]
    if phase == pb.TaskPhase.CALLS:
        assert cancelled_calls == ["slow"]
