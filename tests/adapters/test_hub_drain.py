"""A hub that drains (`Hub.drain`, at the first SIGINT/SIGTERM): it takes no new work, lets
what it took finish, and tells each worker to go with a going-away close."""

from __future__ import annotations

import contextlib
import json

import attrs
import trio
import trio.testing
import trio_websocket

from blockx.hub import Submitted, show_task, submission_from_json, submit
from blockx.hubwire import Error, Recorded, Succeeded
from tests.adapters.hub_harness import (
    CAPABILITY,
    QUEUE,
    TEST_CONFIG,
    HubClient,
    HubRig,
    assert_told_to_go,
    running_hub,
)


async def test_a_draining_hub_answers_what_it_took_then_tells_the_worker_to_go(
    hub_url: str, autojump_clock: trio.testing.MockClock
) -> None:
    async with running_hub(hub_url) as rig:
        token = rig.credential()
        await rig.submit(token, payload={"n": 1})
        async with rig.worker(token, capacity=1) as worker:
            offer = await worker.claim()
            finish = worker.finish_message(offer, Succeeded(result='"done"'))
            await worker.send(finish)
            await trio.testing.wait_all_tasks_blocked()
            with trio.fail_after(1):
                error = await _drain_reading(rig, worker)
            assert rig.hub.draining
            assert_told_to_go(worker, error)
            (answer,) = worker.answers[finish.message_id]
            assert isinstance(answer, Recorded)
        shown = show_task(rig.store, offer.task_id)
        assert shown is not None
        assert shown["state"] == "SUCCEEDED"


async def test_what_a_worker_sends_once_the_drain_began_is_left_for_the_next_hub(
    hub_url: str, autojump_clock: trio.testing.MockClock
) -> None:
    """Reading stops at once: a message sent after the drain began is not taken (the
    worker sends it again, with the same message id, once it has reconnected)."""
    async with running_hub(hub_url) as rig:
        token = rig.credential()
        await rig.submit(token, payload={"n": 1})
        async with rig.worker(token, capacity=1) as worker:
            offer = await worker.claim()
            finish = worker.finish_message(offer, Succeeded(result='"done"'))
            async with trio.open_nursery() as nursery:
                nursery.start_soon(rig.hub.drain)
                await trio.testing.wait_all_tasks_blocked()  # the drain has begun
                with contextlib.suppress(trio_websocket.ConnectionClosed):
                    await worker.send(finish)
                error = await worker.closed()
            assert_told_to_go(worker, error)
            assert finish.message_id not in worker.answers
        shown = show_task(rig.store, offer.task_id)
        assert shown is not None
        assert shown["state"] == "RUNNING"


async def test_a_draining_hub_refuses_new_requests_and_answers_long_polls_now(
    hub_url: str, autojump_clock: trio.testing.MockClock
) -> None:
    async with running_hub(hub_url) as rig:
        token = rig.credential()
        task = await rig.submit(token, payload={"n": 1})
        answered: list[tuple[int, object]] = []

        async def long_poll() -> None:
            target = f"/v1/tasks/{task['task_id']}?wait_ms=30000"
            answered.append(await rig.http("GET", target, token=token))

        rig.nursery.start_soon(long_poll)
        await trio.testing.wait_all_tasks_blocked()
        started_s = trio.current_time()
        await rig.hub.drain()
        await trio.testing.wait_all_tasks_blocked()
        assert trio.current_time() - started_s < 0.1
        ((status, shown),) = answered
        assert status == 200
        assert isinstance(shown, dict)
        assert shown["state"] == "QUEUED"
        status, body = await rig.http("GET", f"/v1/tasks/{task['task_id']}", token=token)
        assert status == 503
        assert "shutting down" in body["error"]


async def test_a_draining_hub_offers_nothing(
    hub_url: str, autojump_clock: trio.testing.MockClock
) -> None:
    async with running_hub(hub_url) as rig:
        token = rig.credential()
        async with rig.worker(token, capacity=2) as worker:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(worker.closed)
                await rig.hub.drain()
            queued = _submit_to_the_database(rig)
            rig.hub.offer_now()
            await trio.testing.wait_all_tasks_blocked()
            assert worker.offers == []
        shown = show_task(rig.store, queued)
        assert shown is not None
        assert (shown["state"], shown["attempts"]) == ("QUEUED", [])


async def test_the_drain_waits_for_what_is_under_way_up_to_its_timeout(
    hub_url: str, autojump_clock: trio.testing.MockClock
) -> None:
    async with running_hub(hub_url, attrs.evolve(TEST_CONFIG, drain_timeout_ms=2_000)) as rig:
        stream = await rig.open_stream()  # a producer's request whose body never comes
        head = f"POST /v1/queues/{QUEUE}/tasks HTTP/1.1\r\nhost: h\r\ncontent-length: 9\r\n\r\n"
        await stream.send_all(head.encode())
        await trio.testing.wait_all_tasks_blocked()
        started_s = trio.current_time()
        await rig.hub.drain()
        assert trio.current_time() - started_s == 2.0


async def _drain_reading(rig: HubRig, worker: HubClient) -> Error | None:
    """Drain the hub while the worker reads (as a worker does): the `Error` it got last."""
    closed: list[Error | None] = []

    async def read() -> None:
        closed.append(await worker.closed())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(read)
        await rig.hub.drain()
    return closed[0]


def _submit_to_the_database(rig: HubRig) -> str:
    """Queue a task as `blockx hub submit` does, on the database directly; its id."""
    document = {
        "handler": CAPABILITY.handler,
        "handler_version": CAPABILITY.handler_version,
        "payload_version": CAPABILITY.payload_version,
        "payload": {"n": 2},
    }
    outcome = submit(rig.store, submission_from_json(json.dumps(document), QUEUE), rig.now_ms())
    assert isinstance(outcome, Submitted)
    return outcome.task.task_id
