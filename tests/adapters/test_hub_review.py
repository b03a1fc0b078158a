"""Review and redrive over the hub's HTTP API, on SQLite and on PostgreSQL.

An admin lists a queue's tasks a page at a time and retries, resolves or
cancels them, one by one or over a filter; each action is refused where the
rules say so, kept under its request id, and written in the task's history
with the credential that did it. Time is Trio's virtual clock.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio
import trio.testing

from blockx.hub import Right, _ops, _review, show_task
from blockx.hubwire import Failed, Unknown, dumps
from tests.adapters.autoworker_rig import state_of, worker
from tests.adapters.hub_harness import QUEUE, HubRig, running_hub


def credential_id(token: str) -> str:
    return token.removeprefix("bxc_").partition(".")[0]


def shown(rig: HubRig, task_id: str) -> dict[str, Any]:
    """The task as `hub task show` prints it, read back."""
    task = show_task(rig.store, task_id)
    assert task is not None
    decoded: dict[str, Any] = json.loads(dumps(task))
    return decoded


async def needs_review(rig: HubRig, token: str, **fields: Any) -> str:
    """A task whose one attempt ended of unknown effect: NEEDS_REVIEW."""
    task_id: str = (await rig.submit(token, **fields))["task_id"]
    async with rig.worker(token, instance_id=f"w-{task_id}") as scripted:
        offer = await scripted.claim()
        assert offer.task_id == task_id
        await scripted.finish(offer, Unknown(code="CONNECTION_RESET"))
    assert (await rig.task(token, task_id))["state"] == "NEEDS_REVIEW"
    return task_id


async def act(
    rig: HubRig, admin: str, task_id: str, action: str, **body: object
) -> tuple[int, Any]:
    body.setdefault("request_id", f"{action}-{task_id}")
    return await rig.http("POST", f"/v1/tasks/{task_id}:{action}", token=admin, body=body)


async def test_a_retried_task_gets_a_new_attempt_that_an_automatic_worker_runs(
    hub_url: str, autojump_clock: trio.testing.MockClock
) -> None:
    async with running_hub(hub_url) as rig:
        token = rig.credential()
        admin = rig.credential(QUEUE, Right.ADMIN)
        task_id = await needs_review(rig, token, max_attempts=1)
        auto = worker(rig, token)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(auto.run)  # idle until the retry queues the task
            await trio.sleep(1)
            status, retried = await act(rig, admin, task_id, "retry")
            assert status == 200, retried
            assert (retried["state"], retried["max_attempts"]) == ("QUEUED", 2)
            done = await state_of(rig, token, task_id, "SUCCEEDED")
            nursery.cancel_scope.cancel()
        task = shown(rig, task_id)
    assert done["result"] == {"n": 1}
    first, second = task["attempts"]
    assert (first["epoch"], first["state"]) == (1, "UNKNOWN")  # the old attempt stays ended
    assert (second["epoch"], second["state"]) == (2, "SUCCEEDED")
    assert first["attempt_id"] != second["attempt_id"]
    [entry] = [e for e in task["history"] if e["kind"] == "RETRIED"]
    assert entry["detail"]["by"] == credential_id(admin)
    assert entry["detail"]["request_id"] == f"retry-{task_id}"
    assert entry["detail"]["max_attempts"] == 2


async def test_resolve_ends_a_task_as_the_operator_says(
    hub_url: str, autojump_clock: trio.testing.MockClock
) -> None:
    async with running_hub(hub_url) as rig:
        token = rig.credential()
        admin = rig.credential(QUEUE, Right.ADMIN)
        succeeded, failed = [await needs_review(rig, token) for _ in range(2)]
        body = '{"request_id": "r1", "outcome": "SUCCEEDED", "result": {"paid": 1.10}}'
        status, text = await rig.http_text(
            "POST", f"/v1/tasks/{succeeded}:resolve", token=admin, raw=body.encode()
        )
        assert status == 200, text
        assert '"result":{"paid": 1.10}' in text  # kept as it was written
        status, ended = await act(
            rig, admin, failed, "resolve", outcome="FAILED", code="CHARGED_TWICE", details=[1]
        )
        assert status == 200, ended
        task = shown(rig, succeeded)
    assert (ended["state"], ended["failure"]) == (
        "FAILED",
        {"code": "CHARGED_TWICE", "details": [1]},
    )
    assert (task["state"], task["result"]) == ("SUCCEEDED", {"paid": 1.1})
    assert [a["state"] for a in task["attempts"]] == ["UNKNOWN"]  # no attempt is touched
    resolved = task["history"][-1]
    assert resolved["kind"] == "RESOLVED"
    assert resolved["detail"]["by"] == credential_id(admin)
    assert resolved["detail"]["state"] == "SUCCEEDED"


async def test_each_action_is_refused_where_the_rules_say(
    hub_url: str, autojump_clock: trio.testing.MockClock
) -> None:
    async with running_hub(hub_url) as rig:
        token = rig.credential()
        admin = rig.credential(QUEUE, Right.ADMIN)
        running = (await rig.submit(token))["task_id"]
        queued = (await rig.submit(token, handler="other"))["task_id"]  # no worker takes it
        async with rig.worker(token) as scripted:
            offer = await scripted.claim()
            assert offer.task_id == running
            refused = {
                action: await act(rig, admin, running, action, outcome="FAILED", code="X")
                if action == "resolve"
                else await act(rig, admin, running, action)
                for action in ("retry", "resolve", "cancel")
            }
            await scripted.finish(offer, Failed(code="BROKEN"))
        failed = await act(rig, admin, running, "retry", request_id="after it failed")
        assert (await act(rig, admin, queued, "retry"))[0] == 409
        assert (await act(rig, admin, queued, "cancel"))[0] == 200
        status, again = await act(rig, admin, queued, "cancel", request_id="another")
        missing = await act(rig, admin, "no-such-task", "cancel")
    for status_and_body in refused.values():
        assert status_and_body[0] == 409
        assert status_and_body[1]["state"] == "RUNNING"
    assert "under way" in refused["cancel"][1]["error"]
    assert (status, again["state"]) == (409, "CANCELLED")
    assert "only a QUEUED task can be cancelled" in again["error"]
    assert missing[0] == 404
    assert (failed[0], failed[1]["state"]) == (200, "QUEUED")


async def test_a_repeated_request_id_gets_the_first_answer_and_does_nothing_more(
    hub_url: str, autojump_clock: trio.testing.MockClock
) -> None:
    async with running_hub(hub_url) as rig:
        token = rig.credential()
        admin = rig.credential(QUEUE, Right.ADMIN)
        task_id = await needs_review(rig, token, max_attempts=1)
        first = await act(rig, admin, task_id, "retry", request_id="once")
        cancelled = await act(rig, admin, task_id, "cancel", request_id="c")
        repeated = await act(rig, admin, task_id, "retry", request_id="once")
        cancelled_again = await act(rig, admin, task_id, "cancel", request_id="c")
        task = shown(rig, task_id)
        rig.store.read(_ops.forget_receipts(rig.now_ms() + 1, 1_000))  # kept as long as receipts
        forgotten = await act(rig, admin, task_id, "retry", request_id="once")
    assert first[0] == cancelled[0] == 200
    assert repeated == first  # the answer of the time it was done, not the task as it is
    assert cancelled_again == cancelled
    assert (task["state"], task["max_attempts"]) == ("CANCELLED", 2)
    assert [e["kind"] for e in task["history"]].count("RETRIED") == 1
    assert forgotten[0] == 409  # decided anew: the task is CANCELLED now


async def test_pages_follow_a_cursor_without_repeats_or_gaps(
    hub_url: str, autojump_clock: trio.testing.MockClock
) -> None:
    async with running_hub(hub_url) as rig:
        token = rig.credential()
        admin = rig.credential(QUEUE, Right.ADMIN)
        ids = [(await rig.submit(token))["task_id"] for _ in range(3)]
        await trio.sleep(1)
        since_ms = rig.now_ms()
        ids += [(await rig.submit(token, handler="other"))["task_id"] for _ in range(2)]
        seen: list[str] = []
        cursor: str | None = ""
        while cursor is not None:
            query = f"queue={QUEUE}&limit=2" + (f"&cursor={cursor}" if cursor else "")
            status, page = await rig.http("GET", f"/v1/tasks?{query}", token=admin)
            assert status == 200, page
            assert len(page["tasks"]) <= 2
            seen += [task["task_id"] for task in page["tasks"]]
            cursor = page["next_cursor"]
            if len(seen) == 2:  # tasks added meanwhile come after the cursor
                ids.append((await rig.submit(token))["task_id"])
        chosen = {}
        for query in (f"handler=other&since_ms={since_ms}", f"until_ms={since_ms}", "state=FAILED"):
            status, page = await rig.http("GET", f"/v1/tasks?queue={QUEUE}&{query}", token=admin)
            chosen[query] = [task["task_id"] for task in page["tasks"]]
    assert seen == ids
    assert list(chosen.values()) == [ids[3:5], ids[:3], []]


async def test_bulk_actions_count_with_a_dry_run_and_act_a_bounded_number(
    hub_url: str, autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_review, "MAX_BULK", 2)
    async with running_hub(hub_url) as rig:
        token = rig.credential()
        admin = rig.credential(QUEUE, Right.ADMIN)
        reviews = [await needs_review(rig, token) for _ in range(3)]
        queued = (await rig.submit(token, handler="other"))["task_id"]
        path = f"/v1/queues/{QUEUE}/tasks"
        dry = {"request_id": "d", "state": "NEEDS_REVIEW", "dry_run": True}
        counted = await rig.http("POST", f"{path}:retry", token=admin, body=dry)
        body = {"request_id": "b1", "state": "NEEDS_REVIEW"}
        first = await rig.http("POST", f"{path}:retry", token=admin, body=body)
        repeated = await rig.http("POST", f"{path}:retry", token=admin, body=body)
        rest = await rig.http(
            "POST", f"{path}:retry", token=admin, body=body | {"request_id": "b2"}
        )
        cancel = {"request_id": "c", "handler": "other"}
        cancelled = await rig.http("POST", f"{path}:cancel", token=admin, body=cancel)
        states = {t: (await rig.task(token, t))["state"] for t in (*reviews, queued)}
    assert counted == (200, {"dry_run": True, "count": 3})
    assert first == repeated == (200, {"dry_run": False, "count": 2, "more": True})
    assert rest == (200, {"dry_run": False, "count": 1, "more": False})
    assert cancelled == (200, {"dry_run": False, "count": 1, "more": False})
    assert states[queued] == "CANCELLED"
    assert all(states[t] in ("QUEUED", "OFFERED") for t in reviews)


async def test_only_an_admin_may_review(
    hub_url: str, autojump_clock: trio.testing.MockClock
) -> None:
    async with running_hub(hub_url) as rig:
        producer = rig.credential(QUEUE, Right.PRODUCER)
        task_id = (await rig.submit(producer))["task_id"]
        answers = [
            await rig.http("GET", f"/v1/tasks?queue={QUEUE}", token=producer),
            await act(rig, producer, task_id, "cancel"),
            await rig.http(
                "POST", f"/v1/queues/{QUEUE}/tasks:cancel", token=producer, body={"request_id": "x"}
            ),
        ]
        anonymous = await act(rig, "bxc_nobody.secret", task_id, "cancel")
        still = (await rig.task(producer, task_id))["state"]
    assert [status for status, _ in answers] == [403, 403, 403]
    assert anonymous[0] == 401
    assert still == "QUEUED"


@pytest.mark.parametrize(
    ("target", "body", "field"),
    [
        ("/v1/tasks/{t}:cancel", {}, "request_id"),
        ("/v1/tasks/{t}:cancel", {"request_id": ""}, "request_id"),
        ("/v1/tasks/{t}:cancel", {"request_id": "r", "force": True}, "force"),
        ("/v1/tasks/{t}:resolve", {"request_id": "r"}, "outcome"),
        ("/v1/tasks/{t}:resolve", {"request_id": "r", "outcome": "SUCCEEDED"}, "result"),
        (
            "/v1/tasks/{t}:resolve",
            {"request_id": "r", "outcome": "SUCCEEDED", "result": None},
            "result",
        ),
        ("/v1/tasks/{t}:resolve", {"request_id": "r", "outcome": "FAILED", "code": "bad"}, "code"),
        (
            "/v1/tasks/{t}:resolve",
            {"request_id": "r", "outcome": "FAILED", "code": "X", "result": 1},
            "result",
        ),
        ("/v1/queues/q1/tasks:retry", {"request_id": "r", "state": "QUEUED"}, "state"),
        ("/v1/queues/q1/tasks:cancel", {"request_id": "r", "since_ms": "1"}, "since_ms"),
        ("/v1/queues/q1/tasks:cancel", {"request_id": "r", "dry_run": 1}, "dry_run"),
        ("/v1/queues/q1/tasks:cancel", [], "(body)"),
        ("/v1/tasks?queue=q1&state=DONE", None, "state"),
        ("/v1/tasks?queue=q1&cursor=nonsense", None, "cursor"),
        ("/v1/tasks?queue=q1&limit=0", None, "limit"),
        ("/v1/tasks?state=QUEUED", None, "queue"),
        ("/v1/tasks?queue=q1&color=red", None, "color"),
    ],
)
async def test_a_bad_request_names_its_field(
    hub_url: str, autojump_clock: trio.testing.MockClock, target: str, body: Any, field: str
) -> None:
    async with running_hub(hub_url) as rig:
        admin = rig.credential(QUEUE, Right.ADMIN)
        task_id = (await rig.submit(admin))["task_id"]
        method = "GET" if body is None else "POST"
        status, answer = await rig.http(method, target.format(t=task_id), token=admin, body=body)
        still = (await rig.task(admin, task_id))["state"]
    assert (status, answer["field"]) == (400, field), answer
    assert still == "QUEUED"
