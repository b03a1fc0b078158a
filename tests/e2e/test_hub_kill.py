"""A hub killed with SIGKILL mid-flight and started again loses nothing it acknowledged.

A real `python -m blockx hub` process on SQLite (the default) and on
PostgreSQL, each reached in plain text (HTTP and WS) and over TLS (HTTPS and
WSS). A scripted worker claims every task, has its starts granted, finishes a
third of them and waits for the answers, then sends finishes for another
third and the hub is killed before it can answer them all; the last third
stay running. The hub stays down until every lease has run out, then starts
again on the same database. Then:

* every submission the hub answered exists;
* every finish it answered stands, and a resend gets the very same answer;
* a finish it did not answer either took effect (its resend gets the receipt)
  or arrives too late and is evidence only: never both, never lost halfway;
* every lease that ran out while the hub was down is handled as expired: the
  idempotent tasks are queued again, the others wait for review.

Wall-clock time: the system under test is another process. The test waits
for leases with deadlines the hub itself announced, and polls the hub's
state under a `fail_after`.
"""

from __future__ import annotations

import time
from typing import Any

import trio

from blockx.hubwire import Answer, Disposition, Finish, Granted, Offer, Recorded, Succeeded
from tests.adapters.certificates import Pki
from tests.adapters.hub_harness import QUEUE, HubClient
from tests.e2e.hub_process import HubProcess, hub_process, queue_with_credential

TASKS = 30
LEASE_MS = 1_500
ENV = {
    "HUB_LEASE_MS": str(LEASE_MS),
    "HUB_OFFER_TTL_MS": "60000",
    "HUB_POLL_MS": "20",
    "HUB_SESSION_TTL_MS": "60000",
    "HUB_RETRY_BACKOFF_MS": "1",
    "HUB_MAX_RETRY_BACKOFF_MS": "1",
    "LOG_FORMAT": "text",
}
FAIL_AFTER_S = 120


async def claim_all(worker: HubClient) -> tuple[list[Offer], list[Granted]]:
    offers = [await worker.offer() for _ in range(TASKS)]
    starts = [worker.start_message(offer) for offer in offers]
    await worker.send(*starts)
    grants = [await worker.answer(start.message_id) for start in starts]
    assert all(isinstance(grant, Granted) for grant in grants), grants
    return offers, grants  # type: ignore[return-value]  # checked just above


async def before_the_kill(
    hub: HubProcess, token: str
) -> tuple[dict[str, dict[str, Any]], list[tuple[Finish, Answer]], list[Finish], list[Offer], int]:
    submitted = {}
    for n in range(TASKS):
        task = await hub.submit(token, payload={"n": n}, idempotency=_idempotency(n))
        submitted[task["task_id"]] = task
    async with hub.worker(token, capacity=TASKS) as worker:
        offers, grants = await claim_all(worker)
        acked = [
            worker.finish_message(o, Succeeded(result=str(n))) for n, o in enumerate(offers[:10])
        ]
        await worker.send(*acked)
        answered = [(finish, await worker.answer(finish.message_id)) for finish in acked]
        in_flight = [worker.finish_message(o, Succeeded(result='"late?"')) for o in offers[10:20]]
        await worker.send(*in_flight)
        await hub.kill()
    last_lease_ms = max(grant.lease_deadline_ms for grant in grants)
    return submitted, answered, in_flight, offers[20:], last_lease_ms


def _idempotency(n: int) -> str:
    return "IDEMPOTENT" if n % 2 else "NON_IDEMPOTENT"


async def settled(hub: HubProcess, token: str, task_id: str) -> dict[str, Any]:
    """The task once no attempt of it is running any more (the restarted hub swept it)."""
    while True:
        task = await hub.task(token, task_id)
        if task["state"] != "RUNNING":
            return task
        await trio.sleep(0.02)


async def test_a_killed_hub_loses_nothing_it_acknowledged(
    hub_url: str, hub_tls: Pki | None
) -> None:
    token = queue_with_credential(hub_url, QUEUE)
    with trio.fail_after(FAIL_AFTER_S):
        async with hub_process(hub_url, ENV, hub_tls) as hub:
            submitted, answered, in_flight, running, last_lease_ms = await before_the_kill(
                hub, token
            )
        await trio.sleep(max(last_lease_ms / 1000 - time.time(), 0) + 0.05)
        async with hub_process(hub_url, ENV, hub_tls) as hub:
            async with hub.worker(token, capacity=0) as worker:  # the same instance, back
                resent = [await worker.request(finish) for finish, _ in answered]
                late = [await worker.request(finish) for finish in in_flight]
            tasks = {task_id: await settled(hub, token, task_id) for task_id in submitted}
    assert resent == [answer for _, answer in answered]
    for finish, answer in answered:
        assert isinstance(answer, Recorded)
        assert answer.disposition is Disposition.ACCEPTED
        task = tasks[_task_of(finish, submitted, tasks)]
        assert (task["state"], str(task["result"])) == ("SUCCEEDED", finish.outcome.result)  # type: ignore[union-attr]
    for finish, answer in zip(in_flight, late, strict=True):
        assert isinstance(answer, Recorded)
        task = tasks[_task_of(finish, submitted, tasks)]
        took_effect = task["state"] == "SUCCEEDED"
        assert took_effect == (answer.disposition is Disposition.ACCEPTED)
        assert took_effect or task["attempts"][0]["state"] == "LEASE_EXPIRED"
    for task in (tasks[offer.task_id] for offer in running):
        assert task["attempts"][0]["state"] == "LEASE_EXPIRED"
        expected = "QUEUED" if task["idempotency"] == "IDEMPOTENT" else "NEEDS_REVIEW"
        assert task["state"] == expected
    assert len(tasks) == TASKS


def _task_of(finish: Finish, submitted: dict[str, Any], tasks: dict[str, Any]) -> str:
    """The task whose (first) attempt `finish` reports on."""
    for task_id, task in tasks.items():
        if any(a["attempt_id"] == finish.attempt_id for a in task["attempts"]):
            return task_id
    raise AssertionError(f"no task has attempt {finish.attempt_id} (of {len(submitted)})")
