"""Worker nodes' tasks through the hub, from Python: `HubClient.submit_task`, `submit_tasks`
and `wait_task` against the in-process hub, on Trio's virtual clock.

A node's task is a task file's object, checked before it is sent and carried as the
payload of the capability of the nodes of one profile; its own task_id names it at
the hub, so sending it again queues nothing new.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Final

import pytest
import trio
import trio.testing

from blockx.autoworker import HubClient
from blockx.autoworker._client import ENDED_STATES, MAX_WAIT_MS
from blockx.client import InvalidTaskSpec
from blockx.errors import InvalidValue
from blockx.hub import TaskState
from blockx.hub._api import MAX_WAIT_MS as HUB_MAX_WAIT_MS
from blockx.hubwire import Succeeded, Unknown, node_task_capability
from tests.adapters.autoworker_rig import SQLITE, rig_client
from tests.adapters.hub_harness import QUEUE, HubRig, running_hub

TASKS: Final = Path(__file__).resolve().parents[2] / "examples" / "tasks"


def task_file(name: str) -> dict[str, Any]:
    document: dict[str, Any] = json.loads((TASKS / name).read_text())
    return document


def batch() -> list[dict[str, Any]]:
    lines = (TASKS / "batch.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


async def queued(rig: HubRig, token: str) -> list[dict[str, Any]]:
    status, listed = await rig.http("GET", f"/v1/queues/{QUEUE}/tasks", token=token)
    assert status == 200, listed
    tasks: list[dict[str, Any]] = listed["tasks"]
    return tasks


def test_a_waiter_ends_on_the_hubs_terminal_states_and_waits_as_long_as_it_may() -> None:
    assert {state.value for state in TaskState if state.is_terminal} == ENDED_STATES
    assert MAX_WAIT_MS == HUB_MAX_WAIT_MS


@SQLITE
async def test_a_task_file_is_queued_for_its_profiles_nodes_once(
    hub_url: str, autojump_clock: trio.testing.MockClock
) -> None:
    task = task_file("orders_to_sqlite.json")
    async with running_hub(hub_url) as rig:
        token = rig.credential()
        producer = rig_client(rig, token)
        first = await producer.submit_task(QUEUE, task, max_attempts=1)
        again = await producer.submit_task(QUEUE, task, max_attempts=1)
        bundle = await producer.submit_task(
            QUEUE, task_file("shout.json"), deployment="bundle", task_id="shout-1"
        )
        nameless = await producer.submit_task(QUEUE, task_file("shout.json"))
        listed = await queued(rig, token)
    capability = node_task_capability("block")
    assert (first["task_id"], first["handler"]) == ("orders-to-sqlite", capability.handler)
    assert (first["handler_version"], first["payload_version"]) == ("v1", "v1")
    assert first["payload"] == task
    assert again == first  # a repeat, not a second task
    assert (bundle["handler"], bundle["task_id"]) == ("blockx.task.bundle", "shout-1")
    assert bundle["payload"] == {**task_file("shout.json"), "task_id": "shout-1"}
    assert "task_id" not in nameless["payload"]  # the hub named it
    assert len(listed) == 3


@SQLITE
async def test_a_bad_task_is_refused_naming_its_key_and_nothing_is_sent(
    hub_url: str, autojump_clock: trio.testing.MockClock
) -> None:
    tasks = batch()
    tasks[2] = {**tasks[2], "builder": ""}
    async with running_hub(hub_url) as rig:
        token = rig.credential()
        producer = rig_client(rig, token)
        with pytest.raises(InvalidTaskSpec) as one:
            await producer.submit_task(
                QUEUE, {"task_id": "t", "builder": "static", "retry": {"max_attempts": -1}}
            )
        with pytest.raises(InvalidTaskSpec) as listed:
            await producer.submit_task(QUEUE, ["not", "an", "object"])  # type: ignore[arg-type]
        with pytest.raises(InvalidTaskSpec) as many:
            await producer.submit_tasks(QUEUE, tasks)
        with pytest.raises(InvalidValue) as profile:
            await producer.submit_task(QUEUE, batch()[0], deployment="blocks")
        with pytest.raises(InvalidValue) as named:
            await producer.submit_tasks(QUEUE, batch(), task_id="one-for-all")
        assert await queued(rig, token) == []
    assert one.value.field == "retry.max_attempts"
    assert listed.value.field == "file"
    assert str(many.value) == "task [2].builder = '': must be a non-empty string"
    assert (profile.value.field, profile.value.allowed) == (
        "deployment",
        "a worker node's profile: block, bundle",
    )
    assert named.value.field == "task_id"


@SQLITE
async def test_many_tasks_are_queued_in_batches_each_answered(
    hub_url: str, autojump_clock: trio.testing.MockClock
) -> None:
    tasks = batch()
    async with running_hub(hub_url) as rig:
        producer = rig_client(rig, rig.credential())
        answers = await producer.submit_tasks(QUEUE, tasks, idempotency="IDEMPOTENT")
        again = await producer.submit_tasks(QUEUE, tasks, idempotency="IDEMPOTENT")
        read = await producer.task("batch-sum")
    assert [answer["status"] for answer in answers] == [201] * 5
    assert [answer["status"] for answer in again] == [200] * 5
    assert [answer["task_id"] for answer in answers] == [task["task_id"] for task in tasks]
    assert (read["payload"], read["idempotency"]) == (tasks[0], "IDEMPOTENT")


async def finish(rig: HubRig, token: str, node_id: str, outcome: Succeeded | Unknown) -> None:
    """Take the next node task as a scripted node and end its attempt with `outcome`."""
    capabilities = (node_task_capability("block"),)
    async with rig.worker(
        token, instance_id=node_id, capabilities=capabilities, capacity=1
    ) as node:
        offer = await node.claim()
        await node.finish(offer, outcome)


@SQLITE
async def test_a_wait_asks_again_until_the_task_ends_or_needs_review(
    hub_url: str, autojump_clock: trio.testing.MockClock
) -> None:
    async with running_hub(hub_url) as rig:
        token = rig.credential()
        producer: HubClient = rig_client(rig, token)
        ended: dict[str, dict[str, Any]] = {}

        async def wait(task_id: str) -> None:
            ended[task_id] = await producer.wait_task(task_id)

        async with trio.open_nursery() as nursery:
            for task in batch()[:2]:
                await producer.submit_task(QUEUE, task)
                nursery.start_soon(wait, task["task_id"])
            await trio.sleep(2.5 * MAX_WAIT_MS / 1000)  # longer than two of the hub's waits
            assert ended == {}
            result = '{"state": "SUCCEEDED", "outputs": [42]}'
            await finish(rig, token, "node-1", Succeeded(result=result))
            await finish(rig, token, "node-2", Unknown(code="CONNECTION_RESET"))
    assert ended["batch-sum"]["state"] == "SUCCEEDED"
    assert ended["batch-sum"]["result"] == {"state": "SUCCEEDED", "outputs": [42]}
    assert ended["batch-shout"]["state"] == "NEEDS_REVIEW"  # an end, for a waiter
