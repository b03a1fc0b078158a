"""The order a hub offers tasks in: priorities, submission order, delays, and the limits of
concurrency keys. On SQLite and PostgreSQL, on Trio's virtual clock."""

from __future__ import annotations

import trio
import trio.testing

from blockx.hub import set_key_limit
from blockx.hubwire import Succeeded
from tests.adapters.hub_harness import QUEUE, running_hub


async def test_tasks_of_one_millisecond_are_offered_in_submission_order_whatever_their_ids(
    hub_url: str, autojump_clock: trio.testing.MockClock
) -> None:
    async with running_hub(hub_url) as rig:
        token = rig.credential()
        before = rig.now_ms()
        for n in range(6):  # ids chosen by the producer, sorting against the submissions
            await rig.submit(token, payload={"n": n}, task_id=f"t{9 - n}")
        assert rig.now_ms() == before  # all in one millisecond
        async with rig.worker(token, capacity=6) as worker:
            await worker.listen(1)
    assert [o.payload for o in worker.offers] == [f'{{"n": {n}}}' for n in range(6)]


async def test_higher_priorities_go_first_and_equal_ones_in_submission_order(
    hub_url: str, autojump_clock: trio.testing.MockClock
) -> None:
    async with running_hub(hub_url) as rig:
        token = rig.credential()
        for n, priority in enumerate([0, 5, 9, 5, 0, 9]):
            task = await rig.submit(token, payload={"n": n}, priority=priority)
            assert task["priority"] == priority
        default = await rig.submit(token, payload={"n": 6})
        async with rig.worker(token, capacity=7) as worker:
            await worker.listen(1)
    assert default["priority"] == 5
    assert [o.payload for o in worker.offers] == [f'{{"n": {n}}}' for n in (2, 5, 1, 3, 6, 0, 4)]


async def test_a_delayed_task_is_offered_no_sooner_than_its_time(
    hub_url: str, autojump_clock: trio.testing.MockClock
) -> None:
    async with running_hub(hub_url) as rig:
        token = rig.credential()
        start_ms = rig.now_ms()
        later = await rig.submit(token, payload="later", delay_ms=3_000)
        at = await rig.submit(token, payload="at", run_at_ms=start_ms + 2_000)
        now = await rig.submit(token, payload="now")
        async with rig.worker(token, capacity=3) as worker:
            offered_ms: dict[str, int] = {}
            while len(offered_ms) < 3:
                offer = await worker.offer()
                offered_ms[offer.task_id] = rig.now_ms() - start_ms
    assert later["available_at_ms"] == start_ms + 3_000
    assert offered_ms[now["task_id"]] < 2_000
    poll_ms = 200  # the dispatcher looks at least this often
    assert 2_000 <= offered_ms[at["task_id"]] <= 2_000 + poll_ms
    assert 3_000 <= offered_ms[later["task_id"]] <= 3_000 + poll_ms


async def test_a_delay_that_ends_past_the_total_deadline_is_refused(
    hub_url: str, autojump_clock: trio.testing.MockClock
) -> None:
    async with running_hub(hub_url) as rig:
        token = rig.credential()
        body = {
            "handler": "h",
            "handler_version": "1",
            "payload_version": "1",
            "payload": 1,
            "total_deadline_ms": 5_000,
            "delay_ms": 5_000,
        }
        status, answer = await rig.http("POST", f"/v1/queues/{QUEUE}/tasks", token=token, body=body)
    assert status == 400
    assert answer["field"] == "delay_ms"
    assert "total_deadline_ms" in answer["error"]


async def test_a_concurrency_key_never_has_more_live_attempts_than_its_limit(
    hub_url: str, autojump_clock: trio.testing.MockClock
) -> None:
    async with running_hub(hub_url) as rig:
        token = rig.credential()
        set_key_limit(rig.store, QUEUE, "", 2)  # every key's
        set_key_limit(rig.store, QUEUE, "one", 1)
        for n in range(4):
            await rig.submit(token, payload=f"one{n}", concurrency_key="one")
        for n in range(4):
            await rig.submit(token, payload=f"two{n}", concurrency_key="two")
        await rig.submit(token, payload="free")
        async with rig.worker(token, capacity=8) as worker:
            await worker.listen(1)
            first = [o.payload for o in worker.offers]
            held = worker.offers[0]
            worker.offers.clear()
            await worker.start(held)
            await worker.listen(1)
            assert worker.offers == []  # full: its offers count, started or not
            await worker.finish(held, Succeeded(result="1"))
            await worker.listen(1)
    assert first == ['"one0"', '"two0"', '"two1"', '"free"']
    assert [o.payload for o in worker.offers] == ['"one1"']
