"""A worker node fed by the in-process hub (`blockx.hubnode.HubFeed`), on Trio's virtual clock.

The node is the in-process worker of tests/adapters/worker_harness.py (real slot
table and gRPC API, fake executors: `demo.add`, `demo.fail`, `demo.hang`); the
hub is tests/adapters/hub_harness.py's. Every hub task here is a node's task:
its capability is `node_task_capability("block")`, its payload a task file's
object.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Final

import trio
import trio.testing

from blockx._proto.blockx.worker import v1 as pb
from blockx.autoworker import HubClient
from blockx.hubnode import HubFeed
from blockx.hubwire import Capability, node_task_capability
from blockx.process.clock import EpochClock
from tests.adapters.autoworker_rig import (
    SQLITE,
    TappedClient,
    TappedLine,
    rig_client,
    state_of,
)
from tests.adapters.hub_harness import EPOCH_MS, QUEUE, HubRig, running_hub
from tests.adapters.worker_harness import Harness, running_worker, virtual_clock_config

BLOCK: Final = node_task_capability("block")
SLOTS: Final = 2


def add_task(a: int, b: int) -> dict[str, Any]:
    """A task file's object: one call of `demo.add`, its value kept by the `result` plugin."""
    call = {"function": "demo.add", "args": [a, b]}
    return {"builder": "call_list", "payload": {"calls": [call]}, "plugin": "result"}


def calling(function: str) -> dict[str, Any]:
    return {"builder": "call_list", "payload": {"calls": [{"function": function, "args": []}]}}


async def submit(
    rig: HubRig, token: str, task: object, capability: Capability = BLOCK, **fields: object
) -> str:
    submitted = await rig.submit(
        token,
        QUEUE,
        handler=capability.handler,
        handler_version=capability.handler_version,
        payload_version=capability.payload_version,
        payload=task,
        **fields,
    )
    return str(submitted["task_id"])


@asynccontextmanager
async def fed_node(
    rig: HubRig, client: HubClient, **settings: object
) -> AsyncIterator[tuple[Harness, HubFeed]]:
    """A node of `SLOTS` slots taking the tasks of the rig's queue, drained on exit."""
    config = virtual_clock_config(**{"worker.taskSlots": SLOTS, **settings})
    async with running_worker(config) as node:
        feed = HubFeed(
            client=client,
            queue_id=QUEUE,
            deployment="block",
            slot_table=node.serving.slot_table,
            free_slots=node.serving.free_slots,
            slots=SLOTS,
            drain_timeout_ms=1_000,
            clock=EpochClock(epoch_ms=EPOCH_MS),  # the hub's: leases are read as it gives them
        )
        async with trio.open_nursery() as nursery:
            nursery.start_soon(feed.run)
            yield node, feed
            feed.stop()
        assert feed.failure is None


async def node_result(node: Harness, task_id: str) -> pb.TaskResult:
    """The node's result of `task_id` once it has one (polled on the virtual clock)."""
    while True:
        answer = await node.call(
            node.stub.get_task_result, pb.GetTaskResultRequest(task_id=task_id)
        )
        if answer.result is not None and answer.result.task_id:
            return answer.result
        await trio.sleep(0.05)


@SQLITE
async def test_each_end_of_a_node_task_is_reported_as_the_table_says(
    hub_url: str, autojump_clock: trio.testing.MockClock
) -> None:
    async with running_hub(hub_url) as rig:
        token = rig.credential(QUEUE)
        added = await submit(rig, token, add_task(2, 3))
        failed = await submit(rig, token, calling("demo.fail"))
        invalid = await submit(rig, token, {"builder": 5})
        other = await submit(rig, token, add_task(1, 1), capability=node_task_capability("bundle"))
        async with fed_node(rig, rig_client(rig, token)):
            ended = [
                await state_of(rig, token, task_id, "SUCCEEDED", "FAILED")
                for task_id in (added, failed, invalid)
            ]
            await trio.sleep(5)
            unoffered = await rig.task(token, other)
    succeeded, raised, refused = ended
    assert succeeded["state"] == "SUCCEEDED"
    assert succeeded["result"]["outputs"] == [5]
    assert succeeded["result"]["taskId"] == f"{added}#1"  # the attempt's epoch names it
    assert succeeded["result"]["state"] == "TASK_STATE_SUCCEEDED"
    assert raised["failure"]["code"] == "CALL_RAISED"  # deterministic: never retried
    assert raised["failure"]["details"]["failureCode"] == "CALL_RAISED"
    assert (raised["started_attempts"], raised["state"]) == (1, "FAILED")
    assert refused["failure"]["code"] == "INVALID_TASK"
    assert refused["failure"]["details"]["field"] == "builder"
    assert (unoffered["state"], unoffered["started_attempts"]) == ("QUEUED", 0)


@SQLITE
async def test_a_node_full_of_its_own_tasks_is_offered_nothing_until_a_slot_frees(
    hub_url: str, autojump_clock: trio.testing.MockClock
) -> None:
    async with running_hub(hub_url) as rig:
        token = rig.credential(QUEUE)
        async with fed_node(rig, rig_client(rig, token)) as (node, _):
            for n in range(SLOTS):  # every slot reserved by a gRPC client for 3 s
                reserve = pb.RequestTaskSlotRequest(task_id=f"grpc-{n}", ttl_ms=3_000)
                await node.call(node.stub.request_task_slot, reserve)
            reserved_at = trio.current_time()
            task_id = await submit(rig, token, add_task(20, 22))
            await trio.sleep(2)
            waiting = await rig.task(token, task_id)
            done = await state_of(rig, token, task_id, "SUCCEEDED")
            ran_after_s = trio.current_time() - reserved_at
    assert (waiting["state"], waiting["started_attempts"]) == ("QUEUED", 0)
    assert done["result"]["outputs"] == [42]
    assert ran_after_s >= 3  # only once the reservations lapsed


@SQLITE
async def test_a_lease_the_hub_ends_cancels_the_task_and_frees_its_slot(
    hub_url: str, autojump_clock: trio.testing.MockClock
) -> None:
    async with running_hub(hub_url) as rig:
        token = rig.credential(QUEUE)
        line = TappedLine(rig=rig)
        client = TappedClient(url="http://hub.test:80", credential=token, line=line)
        # A call may run far longer than the lease: only the lease ends it.
        async with fed_node(rig, client, **{"dispatcher.callDeadlineMs": 600_000}) as (node, _):
            task_id = await submit(rig, token, calling("demo.hang"))
            await node.calls.hanging.wait()
            line.down = True  # no renewal reaches the hub from now on
            await line.cut()
            result = await node_result(node, f"{task_id}#1")
            hub_task = await state_of(rig, token, task_id, "NEEDS_REVIEW")
            free = node.serving.free_slots.count
            line.down = False  # the drain confirms the late report (kept as evidence)
    assert (result.state, result.failure_code) == (pb.TaskState.FAILED, "LEASE_LOST")
    assert node.calls.cancelled == [f"{task_id}#1"]  # its call was stopped on the executor
    assert free == SLOTS
    assert hub_task["attempts"][0]["state"] == "LEASE_EXPIRED"  # not idempotent: a person decides


@SQLITE
async def test_a_draining_node_reports_what_it_had_to_end_as_retryable_and_takes_nothing_new(
    hub_url: str, autojump_clock: trio.testing.MockClock
) -> None:
    async with running_hub(hub_url) as rig:
        token = rig.credential(QUEUE)
        settings = {"drainTimeoutMs": 1_000, "dispatcher.callDeadlineMs": 600_000}
        async with fed_node(rig, rig_client(rig, token), **settings) as (node, feed):
            task_id = await submit(rig, token, calling("demo.hang"))
            await node.calls.hanging.wait()
            feed.stop()  # as the node's drain does: no new grants ...
            node.stop.set()  # ... and the slot table ends what is left after drainTimeoutMs
            await feed.finished.wait()
            later = await submit(rig, token, add_task(1, 2))
            await trio.sleep(5)
            requeued = await rig.task(token, task_id)
            untaken = await rig.task(token, later)
    assert feed.failure is None  # every result was confirmed
    [attempt] = requeued["attempts"]
    assert attempt["outcome"]["code"] == "WORKER_SHUTDOWN"
    assert attempt["outcome"]["retryable"] is True
    assert (requeued["state"], requeued["started_attempts"]) == ("QUEUED", 1)
    assert untaken["started_attempts"] == 0
