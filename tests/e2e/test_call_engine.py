"""The dispatcher actor end to end: real executor processes, the dispatch core, code epochs.

`CallEngine` runs a real `DispatcherActor` driving a real `ExecutorPoolManager`
and plays the slot table around them: each task's calls go with the task's
`FunctionSnapshot` (executors' code requests are answered from it). Gates and markers are files in
`tmp_path`, so a test can hold a call at a known point without sleeping in the
call path (the test only polls for files a real process writes).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import trio

from blockx.actors import CallEngine
from blockx.calls import (
    CallFailurePolicy,
    CallPhaseOutcome,
    CallSpec,
    FailureCode,
    decode_value,
    encode_args,
)
from blockx.config import DispatcherSection, default_config
from blockx.functions import FunctionSnapshot
from tests.e2e.processes import alive

FAST: dict[str, Any] = {
    "executor_count": 2,
    "heartbeat_interval_ms": 50,
    "heartbeat_timeout_ms": 1_000,
    "stall_timeout_ms": 400,
    "health_check_interval_ms": 20,
    "restart_delay_ms": 50,
    "grace_ms": 2_000,
}

WORK = """
import os
import time

import blockx

VERSION = 1


def add(a, b):
    return a + b


def version(_i):
    return VERSION


def crash_once(marker):
    if not os.path.exists(marker):
        open(marker, "w").close()
        os._exit(17)
    return "survived"


def spin_once(marker):
    if not os.path.exists(marker):
        open(marker, "w").close()
        while True:
            pass
    return "unstuck"


def gated_version(gate_dir, i):
    open(os.path.join(gate_dir, f"reached-{i}"), "w").close()
    while not os.path.exists(os.path.join(gate_dir, f"open-{i}")):
        time.sleep(0.005)
    return VERSION


def chain(n):
    if n == 0:
        return 0
    return 1 + blockx.subcall("work.chain", n - 1)


def boom(message):
    raise ValueError(message)
"""


CODE = FunctionSnapshot.of({"work": WORK})


def calls(function: str, *arg_lists: tuple[object, ...]) -> list[CallSpec]:
    return [
        CallSpec(call_id=f"c{i}", function=function, args=encode_args(args))
        for i, args in enumerate(arg_lists)
    ]


def values(outcome: CallPhaseOutcome) -> list[object]:
    return [decode_value(value) for value in outcome.outputs]


@asynccontextmanager
async def engine(
    settings: DispatcherSection | None = None, **overrides: Any
) -> AsyncIterator[CallEngine]:
    config = attrs.evolve(default_config().pool_config(), **{**FAST, **overrides})
    async with CallEngine.open(config, settings=settings) as calls_engine:
        try:
            with trio.fail_after(20):
                await calls_engine.wait_ready()
            yield calls_engine
        finally:
            pids = [view.pid for view in calls_engine.transport.snapshot() if view.pid is not None]
    assert pids, "no executor was running at the end"
    assert not any(alive(pid) for pid in pids), "an executor outlived its pool"


async def wait_for_restarts(engine: CallEngine, count: int) -> None:
    """Until `count` executors have been replaced and are serving again."""
    with trio.fail_after(20):
        while True:
            views = engine.transport.snapshot()
            if sum(view.restarts for view in views) >= count and all(
                view.state.value in ("READY", "BUSY") for view in views
            ):
                return
            await trio.sleep(0.01)


async def wait_for_file(path: Path) -> None:
    with trio.fail_after(20):
        while not path.exists():
            await trio.sleep(0.005)


async def test_a_task_of_many_calls_returns_its_outputs_in_call_order() -> None:
    async with engine() as pool:
        with trio.fail_after(30):
            outcome = await pool.run_calls(
                "t1", CODE, calls("work.add", *[(i, 1) for i in range(500)])
            )
    assert outcome.ok
    assert values(outcome) == [i + 1 for i in range(500)]
    assert outcome.stats.calls_total == 500
    assert outcome.stats.calls_succeeded == 500
    assert outcome.stats.calls_retried == 0


async def test_a_call_whose_executor_dies_is_retried_elsewhere(tmp_path: Path) -> None:
    marker = str(tmp_path / "crashed")
    async with engine() as pool:
        batch = [*calls("work.add", (1, 2), (3, 4)), *calls("work.crash_once", (marker,))]
        batch[2] = CallSpec(call_id="crash", function=batch[2].function, args=batch[2].args)
        with trio.fail_after(30):
            outcome = await pool.run_calls("t1", CODE, batch)
        await wait_for_restarts(pool, 1)
        restarts = sum(executor.restarts for executor in pool.transport.snapshot())
    assert outcome.ok, outcome
    assert values(outcome) == [3, 7, "survived"]
    # The crash call, and whatever else was queued on that executor, ran again.
    assert 1 <= outcome.stats.calls_retried <= 3
    assert restarts == 1


async def test_an_endless_call_is_detected_as_wedged_and_its_executor_replaced(
    tmp_path: Path,
) -> None:
    marker = str(tmp_path / "spun")
    # The stall check, not the call deadline, ends the endless call.
    async with engine(DispatcherSection(call_deadline_ms=30_000)) as pool:
        first_pids = {e.executor_id: e.pid for e in pool.transport.snapshot()}
        with trio.fail_after(30):
            outcome = await pool.run_calls("t1", CODE, calls("work.spin_once", (marker,)))
        await wait_for_restarts(pool, 1)
        after = {e.executor_id: (e.pid, e.restarts) for e in pool.transport.snapshot()}
    assert outcome.ok, outcome
    assert values(outcome) == ["unstuck"]
    assert outcome.stats.calls_retried == 1
    replaced = [eid for eid, (pid, restarts) in after.items() if pid != first_pids[eid]]
    assert len(replaced) == 1
    assert after[replaced[0]][1] == 1
    assert not alive(first_pids[replaced[0]] or 0)


async def test_code_changed_mid_task_does_not_change_what_the_task_sees(tmp_path: Path) -> None:
    gates = str(tmp_path)
    async with engine(DispatcherSection(call_window=1)) as pool:
        outcomes: dict[str, CallPhaseOutcome] = {}

        async def run(task_id: str, snapshot: FunctionSnapshot, specs: list[CallSpec]) -> None:
            outcomes[task_id] = await pool.run_calls(task_id, snapshot, specs)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(
                run, "old", CODE, calls("work.gated_version", (gates, 0), (gates, 1))
            )
            await wait_for_file(tmp_path / "reached-0")
            (tmp_path / "open-0").touch()
            await wait_for_file(tmp_path / "reached-1")
            # The first call has finished and the second is running: change the code.
            new_code = FunctionSnapshot.of({"work": WORK.replace("VERSION = 1", "VERSION = 2")})
            assert new_code.epoch != CODE.epoch
            (tmp_path / "open-1").touch()
            nursery.start_soon(run, "new", new_code, calls("work.version", (0,), (1,)))
    assert values(outcomes["old"]) == [1, 1]
    assert values(outcomes["new"]) == [2, 2]


async def test_a_subcall_chain_deeper_than_the_executor_count_completes() -> None:
    async with engine(executor_count=2) as pool:
        with trio.fail_after(30):
            outcome = await pool.run_calls("t1", CODE, calls("work.chain", (7,), (5,)))
    assert outcome.ok, outcome
    assert values(outcome) == [7, 5]
    assert outcome.stats.subcalls == 12


async def test_a_raising_call_fails_the_task_fast_with_its_code() -> None:
    async with engine() as pool:
        with trio.fail_after(30):
            outcome = await pool.run_calls("t1", CODE, calls("work.boom", ("bad input",)))
    assert not outcome.ok
    assert outcome.failure_code == FailureCode.CALL_RAISED
    assert "bad input" in outcome.message
    assert not outcome.retryable


async def test_an_unknown_function_is_reported_with_its_code() -> None:
    async with engine() as pool:
        with trio.fail_after(30):
            outcome = await pool.run_calls(
                "t1",
                CODE,
                calls("work.nope", ()),
                failure_policy=CallFailurePolicy.BEST_EFFORT,
            )
    assert outcome.ok
    assert [failure.error_code for failure in outcome.failures] == [FailureCode.UNKNOWN_FUNCTION]


async def test_a_module_s_internals_cannot_be_called_and_later_tasks_are_unharmed() -> None:
    """`work.__setattr__("add", None)` would break every later task calling `work.add`."""
    async with engine() as pool:
        with trio.fail_after(30):
            refused = await pool.run_calls("t1", CODE, calls("work.__setattr__", ("add", None)))
            later = await pool.run_calls("t2", CODE, calls("work.add", (1, 2)))
    assert (refused.ok, refused.failure_code) == (False, FailureCode.UNKNOWN_FUNCTION)
    assert "work.__setattr__ in function code epoch" in refused.message
    assert "cannot be called: names starting with '_' are private" in refused.message
    assert later.ok
    assert [decode_value(value) for value in later.outputs] == [3]


async def test_a_cancelled_caller_cancels_its_task_and_the_task_id_can_run_again(
    tmp_path: Path,
) -> None:
    gates = str(tmp_path)
    async with engine() as pool:
        with trio.CancelScope() as scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(
                    pool.run_calls, "t1", CODE, calls("work.gated_version", (gates, 0))
                )
                await wait_for_file(tmp_path / "reached-0")
                scope.cancel()
        assert scope.cancelled_caught
        (tmp_path / "open-0").touch()  # the running call ends; its answer is ignored
        with trio.fail_after(30):
            again = await pool.run_calls("t1", CODE, calls("work.add", (2, 3)))
    assert values(again) == [5]


async def test_call_ids_repeating_within_a_task_are_refused_and_nothing_runs() -> None:
    async with engine() as pool:
        with trio.fail_after(30):
            refused = await pool.run_calls(
                "t1", CODE, [*calls("work.add", (1, 2)), *calls("work.add", (3, 4))]
            )
            after = await pool.run_calls("t2", CODE, calls("work.add", (5, 6)))
        served = sum(view.calls_served for view in pool.transport.snapshot())
    assert refused == CallPhaseOutcome(
        ok=False, failure_code=FailureCode.CALLS_FAILED, message="call ids repeat within the task"
    )
    assert values(after) == [11]
    assert served == 1  # only the call of t2 ever reached an executor
