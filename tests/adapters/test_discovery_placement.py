"""`PlacementClient` against in-process workers, with a directory the test writes.

The workers are real (actors and gRPC, fake executors); the registry is not:
each test builds the `WorkerDirectory` a coordinator would have read from
etcd, which lets it make the view disagree with the workers (a stale free
count, a drain the heartbeat has not shown yet) and check what placement
does about it. Every test runs under `fail_after`.
"""

from __future__ import annotations

import json
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio
import trio_asyncio
from grpclib.const import Status

from blockx._proto.blockx.worker import v1 as pb
from blockx.actors import StartDrain
from blockx.client import NoWorkerAvailable, PlacementClient, WorkerCallError, WorkerClient
from blockx.discovery import WorkerDirectory, WorkerHeartbeat
from tests.adapters.worker_harness import Harness, running_worker, worker_config

FAIL_AFTER_S = 10
PREFIX = "/blockx/workers/"


def free_port() -> int:
    """A loopback port nobody listens on (bound, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def address(harness: Harness) -> str:
    return f"127.0.0.1:{harness.serving.port}"


def beat(worker_addr: str, *, free: int, draining: bool = False) -> WorkerHeartbeat:
    return WorkerHeartbeat(
        address=worker_addr,
        deployment="block",
        slots_total=4,
        reserved_slots=4 - free,
        running_tasks=0,
        free_slots=free,
        executors_healthy=1,
        draining=draining,
        version="0.1.0",
        started_at_ms=1_700_000_000_000,
    )


def directory_of(*workers: WorkerHeartbeat) -> WorkerDirectory:
    directory = WorkerDirectory(prefix=PREFIX)
    directory.reset(
        revision=1, entries=[(PREFIX + worker.address, worker.to_json(), 1) for worker in workers]
    )
    return directory


def add_task(task_id: str, a: int = 1, b: int = 2) -> pb.TaskSpec:
    payload = {"calls": [{"function": "demo.add", "args": [a, b]}]}
    return pb.TaskSpec(
        task_id=task_id,
        function_call=pb.FunctionCallConfig(type="call_list"),
        payload=json.dumps(payload).encode(),
    )


@asynccontextmanager
async def two_workers(slots_a: int = 2, slots_b: int = 2) -> AsyncIterator[tuple[Harness, Harness]]:
    async with (
        running_worker(worker_config(**{"worker.taskSlots": slots_a})) as a,
        running_worker(worker_config(**{"worker.taskSlots": slots_b})) as b,
    ):
        yield a, b


# Each harness runs on its own asyncio loop, and a harness's own channel works only on
# its loop: the tests talk to the workers through clients made on the current loop.


async def fill(harness: Harness, *task_ids: str) -> None:
    async with WorkerClient.connect(address(harness)) as client:
        for task_id in task_ids:
            await client.request_slot(task_id, ttl_ms=60_000)


async def status(harness: Harness) -> pb.GetWorkerStatusResponse:
    async with WorkerClient.connect(address(harness)) as client:
        return await client.status()


async def test_a_task_goes_to_the_worker_with_the_most_free_slots() -> None:
    with trio.fail_after(FAIL_AFTER_S):
        async with two_workers() as (a, b):
            directory = directory_of(beat(address(a), free=1), beat(address(b), free=3))
            async with PlacementClient.over(directory) as placement:
                placed = await placement.place(add_task("t1"))

            assert placed.worker_addr == address(b)
            assert placed.response.task_id == "t1"
            assert placed.response.state == pb.TaskState.RUNNING
            async with WorkerClient.connect(address(b)) as client:
                assert (await client.result("t1")).task_id == "t1"
            directory.check_invariants()


async def test_a_burst_spreads_over_equally_free_workers() -> None:
    with trio.fail_after(FAIL_AFTER_S):
        async with two_workers() as (a, b):
            directory = directory_of(beat(address(a), free=2), beat(address(b), free=2))
            async with PlacementClient.over(directory) as placement:
                placed = [(await placement.place(add_task(f"t{i}"))).worker_addr for i in range(4)]

            assert sorted(placed) == sorted([address(a), address(b)] * 2)
            assert directory.placement_order() == ()  # both counted full until they heartbeat


async def test_a_worker_that_is_full_after_all_is_passed_over() -> None:
    with trio.fail_after(FAIL_AFTER_S):
        async with two_workers(slots_a=1) as (a, b):
            await fill(a, "filler")
            # The view is stale: it still shows a's slot free, and more of them than b's.
            directory = directory_of(beat(address(a), free=3), beat(address(b), free=1))
            async with PlacementClient.over(directory) as placement:
                placed = await placement.place(add_task("t1"))

            assert placed.worker_addr == address(b)
            assert (await status(a)).running_tasks == 0


async def test_a_worker_that_started_draining_is_passed_over() -> None:
    with trio.fail_after(FAIL_AFTER_S):
        async with two_workers() as (a, b):
            a.serving.slot_table.post(StartDrain())  # its heartbeat has not said so yet
            directory = directory_of(beat(address(a), free=4), beat(address(b), free=1))
            async with PlacementClient.over(directory) as placement:
                placed = await placement.place(add_task("t1"))

            assert placed.worker_addr == address(b)


async def test_an_unreachable_worker_is_passed_over() -> None:
    with trio.fail_after(FAIL_AFTER_S):
        async with two_workers() as (_, b):
            gone = f"127.0.0.1:{free_port()}"
            directory = directory_of(beat(gone, free=4), beat(address(b), free=1))
            async with PlacementClient.over(directory) as placement:
                placed = await placement.place(add_task("t1"))

            assert placed.worker_addr == address(b)


async def test_when_every_worker_refuses_the_error_names_each_in_order() -> None:
    with trio.fail_after(FAIL_AFTER_S):
        async with two_workers(slots_a=1, slots_b=1) as (a, b):
            await fill(a, "filler-a")
            await fill(b, "filler-b")
            b.serving.slot_table.post(StartDrain())
            directory = directory_of(beat(address(a), free=2), beat(address(b), free=1))
            async with PlacementClient.over(directory) as placement:
                with pytest.raises(NoWorkerAvailable) as caught:
                    await placement.place(add_task("t1"))

            error = caught.value
            assert [(worker, reason.split(":")[0]) for worker, reason in error.attempts] == [
                (address(a), "RequestTaskSlot RESOURCE_EXHAUSTED"),
                (address(b), "RequestTaskSlot UNAVAILABLE"),
            ]
            assert str(error).startswith(
                f"cannot place task t1 under {PREFIX!r}: every worker tried refused it ("
            )


@pytest.mark.parametrize(
    ("workers", "situation"),
    [
        ((), "no worker is registered there"),
        (
            (beat("a:1", free=4, draining=True), beat("b:1", free=4, draining=True)),
            "all 2 registered workers are draining",
        ),
        (
            (beat("a:1", free=0), beat("b:1", free=4, draining=True)),
            "none of the 2 registered workers has a free slot",
        ),
    ],
)
async def test_with_no_candidate_the_error_says_why(
    workers: tuple[WorkerHeartbeat, ...], situation: str
) -> None:
    with trio.fail_after(FAIL_AFTER_S):
        async with trio_asyncio.open_loop(), PlacementClient.over(directory_of(*workers)) as p:
            with pytest.raises(NoWorkerAvailable) as caught:
                await p.place(add_task("t1"))

    assert str(caught.value) == f"cannot place task t1 under {PREFIX!r}: {situation}"
    assert caught.value.attempts == ()


async def test_a_refusal_about_the_task_itself_is_not_retried_elsewhere() -> None:
    with trio.fail_after(FAIL_AFTER_S):
        async with two_workers() as (a, b):
            directory = directory_of(beat(address(a), free=2), beat(address(b), free=1))
            async with PlacementClient.over(directory) as placement:
                with pytest.raises(WorkerCallError) as caught:
                    await placement.place(add_task(""))  # no task id

            assert caught.value.status == Status.INVALID_ARGUMENT
            assert (await status(b)).reserved_slots == 0


async def test_run_task_places_follows_and_returns_the_result() -> None:
    with trio.fail_after(FAIL_AFTER_S):
        async with two_workers() as (a, b):
            directory = directory_of(beat(address(a), free=2), beat(address(b), free=1))
            updates: list[pb.TaskUpdate] = []
            async with PlacementClient.over(directory) as placement:
                placed, result = await placement.run_task(add_task("t1"), on_update=updates.append)

            assert placed.worker_addr == address(a)
            assert result.state == pb.TaskState.SUCCEEDED
            # A task that ended before the follow began answers with its result, unwatched.
            assert all(update.task_id == "t1" for update in updates)
            assert not updates or updates[-1].is_terminal
            assert a.calls.started == ["t1"]
            assert b.calls.started == []
