"""Many tasks in one request: `POST /v1/queues/{q}/tasks:batch` and `HubClient.submit_many`.

One transaction per batch, each task queued or refused on its own and answered by its
index; a body that is no array of tasks is refused whole.
"""

from __future__ import annotations

import json
from typing import Any, Final

import pytest
import trio
import trio.testing

from blockx.autoworker import HubRequestFailed, RawJson, task_submission
from blockx.hub import Right
from blockx.hubwire import MAX_BATCH_TASKS, queue_batch_path
from tests.adapters.autoworker_rig import rig_client
from tests.adapters.hub_harness import CAPABILITY, QUEUE, running_hub

BATCH: Final = queue_batch_path(QUEUE)


def document(**fields: Any) -> dict[str, Any]:
    return task_submission(CAPABILITY, fields.pop("payload", {"n": 1}), **fields)


async def test_each_task_of_a_batch_is_taken_or_refused_on_its_own(
    hub_url: str, autojump_clock: trio.testing.MockClock
) -> None:
    items = [
        json.dumps(document(task_id="a")),
        '{"handler": "h", "handler_version": "1", "payload_version": "1", "payload": [NaN]}',
        json.dumps(document(task_id="a", payload={"n": 2})),  # the id taken, other content
        json.dumps(document(task_id="a")),  # a repeat: the task as it is
        "[" * 100_000 + "]" * 100_000,
        json.dumps(document(payload={"price": 1.10})).replace("1.1", "1.10"),
    ]
    async with running_hub(hub_url) as rig:
        token = rig.credential()
        status, answer = await rig.http(
            "POST", BATCH, token=token, raw=f"[{','.join(items)}]".encode()
        )
        listed = await rig.http("GET", f"/v1/queues/{QUEUE}/tasks", token=token)
        last = answer["results"][5]["task_id"]
        _, exact = await rig.http_text("GET", f"/v1/tasks/{last}", token=token)
    assert status == 200
    results = answer["results"]
    assert [r["index"] for r in results] == list(range(6))
    assert [r["status"] for r in results] == [201, 400, 409, 200, 400, 201]
    assert (results[1]["field"], results[2]["field"]) == ("payload[0]", "task_id")
    assert results[4]["field"].startswith("[0][0]")  # refused, not recursed into
    assert len(listed[1]["tasks"]) == 2
    assert '"payload":{"price":1.10}' in exact.replace(" ", "")  # as sent


async def test_a_body_that_is_no_array_of_tasks_is_refused_whole(
    hub_url: str, autojump_clock: trio.testing.MockClock
) -> None:
    too_many = "[" + ",".join([json.dumps(document())] * (MAX_BATCH_TASKS + 1)) + "]"
    async with running_hub(hub_url) as rig:
        token = rig.credential()
        answers = [
            await rig.http("POST", BATCH, token=token, raw=body)
            for body in (b'{"tasks": []}', b"[]", b"[1, 2", too_many.encode())
        ]
        got = await rig.http("GET", BATCH, token=token)
        listed = await rig.http("GET", f"/v1/queues/{QUEUE}/tasks", token=token)
    assert [status for status, _ in answers] == [400, 400, 400, 400]
    assert all(answer["field"] == "(body)" for _, answer in answers)
    assert got[0] == 405
    assert listed == (200, {"tasks": []})


async def test_submit_many_sends_batches_and_answers_each_task_in_order(
    hub_url: str, autojump_clock: trio.testing.MockClock
) -> None:
    count = 2 * MAX_BATCH_TASKS + 500
    async with running_hub(hub_url) as rig:
        producer = rig_client(rig, rig.credential())
        answers = await producer.submit_many(
            QUEUE,
            [document(task_id=f"t{n}", payload=RawJson(f'{{"n": {n}.0}}')) for n in range(count)],
        )
        read = await producer.task(f"t{count - 1}")
        worker_only = rig_client(rig, rig.credential(QUEUE, Right.WORKER))
        with pytest.raises(HubRequestFailed) as refused:
            await worker_only.submit_many(QUEUE, [document()])
    assert [a["index"] for a in answers] == list(range(count))
    assert {a["status"] for a in answers} == {201}
    assert answers[-1]["task_id"] == f"t{count - 1}"
    assert read["payload"] == {"n": float(count - 1)}
    assert refused.value.status == 403
