"""`PlacementClient.run_tasks` spreads a batch over in-process workers, one stream each.

As in test_discovery_placement, the workers are real and the registry view is
written by each test, so that it can disagree with the workers.
"""

from __future__ import annotations

import collections

import pytest
import trio
from grpclib.const import Status

from blockx._proto.blockx.worker import v1 as pb
from blockx.actors import StartDrain
from blockx.client import (
    InvalidTaskSpec,
    NoWorkerAvailable,
    PlacementClient,
    TaskOutcome,
    WorkerUnreachable,
)
from blockx.discovery import WorkerDirectory
from tests.adapters.test_discovery_placement import (
    FAIL_AFTER_S,
    PREFIX,
    add_task,
    address,
    beat,
    directory_of,
    free_port,
    two_workers,
)


async def spread(directory: WorkerDirectory, tasks: list[pb.TaskSpec]) -> list[TaskOutcome]:
    async with PlacementClient.over(directory) as placement, placement.run_tasks(tasks) as ended:
        return [outcome async for outcome in ended]


def where(outcomes: list[TaskOutcome]) -> collections.Counter[str]:
    return collections.Counter(outcome.worker_addr for outcome in outcomes)


async def test_a_batch_is_spread_by_free_slots_and_every_task_ends_once() -> None:
    with trio.fail_after(FAIL_AFTER_S):
        async with two_workers() as (a, b):
            directory = directory_of(beat(address(a), free=1), beat(address(b), free=3))
            tasks = [add_task(f"t{i}", i, 1) for i in range(4)]
            outcomes = await spread(directory, tasks)

            assert sorted(outcome.task_id for outcome in outcomes) == [f"t{i}" for i in range(4)]
            assert all(outcome.succeeded for outcome in outcomes)
            assert where(outcomes) == {address(a): 1, address(b): 3}
            assert len(a.calls.started) == 1
            assert len(b.calls.started) == 3
            directory.check_invariants()


async def test_beyond_the_free_slots_the_rest_spreads_evenly_and_waits_in_the_workers() -> None:
    with trio.fail_after(FAIL_AFTER_S):
        async with two_workers() as (a, b):
            directory = directory_of(beat(address(a), free=1), beat(address(b), free=1))
            outcomes = await spread(directory, [add_task(f"t{i}") for i in range(10)])

            assert all(outcome.succeeded for outcome in outcomes)
            assert where(outcomes) == {address(a): 5, address(b): 5}


async def test_tasks_a_draining_worker_refuses_are_placed_on_another() -> None:
    with trio.fail_after(FAIL_AFTER_S):
        async with two_workers() as (a, b):
            a.serving.slot_table.post(StartDrain())  # its heartbeat has not said so yet
            directory = directory_of(beat(address(a), free=4), beat(address(b), free=1))
            outcomes = await spread(directory, [add_task(f"t{i}") for i in range(3)])

            assert all(outcome.succeeded for outcome in outcomes)
            assert where(outcomes) == {address(b): 3}
            assert a.calls.started == []


async def test_when_every_worker_refuses_a_task_ends_naming_each_in_order() -> None:
    with trio.fail_after(FAIL_AFTER_S):
        async with two_workers() as (a, b):
            for worker in (a, b):
                worker.serving.slot_table.post(StartDrain())
            directory = directory_of(beat(address(a), free=2), beat(address(b), free=1))
            [outcome] = await spread(directory, [add_task("t1")])

    assert isinstance(outcome.error, NoWorkerAvailable)
    assert outcome.worker_addr == ""
    assert [(worker, reason.split(":")[0]) for worker, reason in outcome.error.attempts] == [
        (address(a), "RunTasks UNAVAILABLE"),
        (address(b), "RunTasks UNAVAILABLE"),
    ]


async def test_a_refusal_about_the_task_itself_is_not_placed_elsewhere() -> None:
    with trio.fail_after(FAIL_AFTER_S):
        async with two_workers() as (a, b):
            directory = directory_of(beat(address(a), free=2), beat(address(b), free=1))
            outcomes = await spread(directory, [add_task(""), add_task("ok")])

            by_id = {outcome.task_id: outcome for outcome in outcomes}
            refusal = by_id[""].refusal
            assert refusal is not None
            assert refusal.status == Status.INVALID_ARGUMENT
            assert by_id[""].worker_addr == address(a)
            assert by_id["ok"].succeeded
            assert a.calls.started == []  # "" was refused there, "ok" went to b (then as free)
            assert b.calls.started == ["ok"]


async def test_an_unreachable_worker_ends_its_tasks_and_the_others_run() -> None:
    with trio.fail_after(FAIL_AFTER_S):
        async with two_workers() as (_, b):
            gone = f"127.0.0.1:{free_port()}"
            directory = directory_of(beat(gone, free=1), beat(address(b), free=1))
            outcomes = await spread(directory, [add_task(f"t{i}") for i in range(4)])

    lost = [outcome for outcome in outcomes if outcome.worker_addr == gone]
    assert len(lost) == 2
    assert all(isinstance(outcome.error, WorkerUnreachable) for outcome in lost)
    assert all(outcome.succeeded for outcome in outcomes if outcome.worker_addr != gone)
    assert where(outcomes) == {gone: 2, address(b): 2}


async def test_a_task_id_twice_in_a_batch_is_refused_before_anything_is_sent() -> None:
    with trio.fail_after(FAIL_AFTER_S):
        async with two_workers() as (a, _):
            directory = directory_of(beat(address(a), free=2))
            with pytest.raises(InvalidTaskSpec, match="appears twice"):
                await spread(directory, [add_task("t1"), add_task("t2"), add_task("t1")])
            assert a.calls.started == []


async def test_with_no_worker_registered_each_task_ends_saying_so() -> None:
    with trio.fail_after(FAIL_AFTER_S):
        async with two_workers():
            outcomes = await spread(directory_of(), [add_task("t1"), add_task("t2")])

    assert [outcome.task_id for outcome in outcomes] == ["t1", "t2"]
    assert [str(outcome.error) for outcome in outcomes] == [
        f"cannot place task {task_id} under {PREFIX!r}: no worker is registered there"
        for task_id in ("t1", "t2")
    ]
