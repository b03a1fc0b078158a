"""Hubs sharing a PostgreSQL database hear of queued work at once (LISTEN/NOTIFY).

Both hubs poll only every minute here, so an offer that comes within seconds
came from the notification of the commit that queued the task: made through
the other hub's API, or by a command on the database. On Trio's real clock
(a virtual one would jump to the poll while the notification is on its way).
"""

from __future__ import annotations

from typing import Final

import attrs
import trio

from blockx.hub import Idempotency, Submission, Submitted, pause_queue, submit
from tests.adapters.hub_harness import CAPABILITY, QUEUE, TEST_CONFIG, running_hub

SLOW_POLL: Final = attrs.evolve(TEST_CONFIG, poll_ms=60_000)
WITHIN_S: Final = 10.0
"""Far below the poll's minute, far above what a notification takes on a loaded machine."""
ONE_TASK: Final = Submission(
    queue_id=QUEUE,
    capability=CAPABILITY,
    payload="1",
    idempotency=Idempotency.IDEMPOTENT,
    max_attempts=1,
    total_deadline_ms=600_000,
    attempt_timeout_ms=60_000,
)


async def test_a_task_queued_through_one_hub_is_offered_at_once_by_another(
    postgres_url: str,
) -> None:
    async with (
        running_hub(postgres_url, SLOW_POLL) as one,
        running_hub(postgres_url, SLOW_POLL) as other,
    ):
        token = one.credential()
        async with other.worker(token) as worker:
            with trio.fail_after(WITHIN_S):
                task = await one.submit(token)
                offer = await worker.offer()
    assert offer.task_id == task["task_id"]


async def test_a_task_queued_by_a_command_is_offered_at_once(postgres_url: str) -> None:
    async with running_hub(postgres_url, SLOW_POLL) as hub:
        token = hub.credential()
        async with hub.worker(token) as worker:
            with trio.fail_after(WITHIN_S):
                submitted = submit(hub.store, ONE_TASK, hub.now_ms())
                offer = await worker.offer()
    assert isinstance(submitted, Submitted)
    assert offer.task_id == submitted.task.task_id


async def test_a_queue_resumed_by_a_command_is_offered_from_at_once(postgres_url: str) -> None:
    async with running_hub(postgres_url, SLOW_POLL) as hub:
        token = hub.credential()
        pause_queue(hub.store, QUEUE, True)
        submitted = submit(hub.store, ONE_TASK, hub.now_ms())
        async with hub.worker(token) as worker:
            with trio.fail_after(WITHIN_S):
                pause_queue(hub.store, QUEUE, False)
                offer = await worker.offer()
    assert isinstance(submitted, Submitted)
    assert offer.task_id == submitted.task.task_id


async def test_a_delayed_task_is_offered_when_its_delay_ends_not_at_the_next_poll(
    postgres_url: str,
) -> None:
    async with running_hub(postgres_url, SLOW_POLL) as hub:
        token = hub.credential()
        async with hub.worker(token) as worker:
            with trio.fail_after(WITHIN_S):
                task = await hub.submit(token, delay_ms=1_000)
                submitted_at = trio.current_time()
                offer = await worker.offer()
            waited_s = trio.current_time() - submitted_at
    assert offer.task_id == task["task_id"]
    assert 0.9 <= waited_s < WITHIN_S
