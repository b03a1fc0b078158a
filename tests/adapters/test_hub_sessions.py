"""The hub's worker protocol, driven by a scripted worker, on SQLite and on PostgreSQL.

Every test runs twice (`hub_url`): on a SQLite file and on a database of its
own on a real PostgreSQL. Time is Trio's virtual clock: sleeping past a
lease makes it run out exactly then.
"""

from __future__ import annotations

import trio
import trio.testing

from blockx.hub import Right, create_queue
from blockx.hubwire import (
    MAX_JSON_BYTES,
    AttemptRef,
    AttemptStatus,
    Disposition,
    Drain,
    DrainAck,
    ErrorCode,
    Failed,
    Finish,
    Granted,
    Heartbeat,
    OpenSession,
    Recorded,
    RefusalCode,
    Refused,
    Resume,
    Resumed,
    Start,
    Succeeded,
    Unknown,
)
from tests.adapters.hub_harness import (
    CAPABILITY,
    EPOCH_MS,
    OTHER_CAPABILITY,
    TEST_CONFIG,
    running_hub,
)

LEASE_S = TEST_CONFIG.lease_ms / 1000
OFFER_TTL_S = TEST_CONFIG.offer_ttl_ms / 1000


def kinds(task: dict[str, object]) -> list[str]:
    history = task["history"]
    assert isinstance(history, list)
    return [entry["kind"] for entry in history]


async def test_claim_renew_finish(hub_url: str, autojump_clock: trio.testing.MockClock) -> None:
    async with running_hub(hub_url) as rig:
        token = rig.credential()
        submitted = await rig.submit(token, payload={"image": "a.png"})
        async with rig.worker(token) as worker:
            offer = await worker.offer()
            assert (offer.task_id, offer.epoch, offer.capability) == (
                submitted["task_id"],
                1,
                CAPABILITY,
            )
            assert offer.payload == '{"image": "a.png"}'  # the text as submitted
            granted = await worker.start(offer)
            assert granted == Granted(
                reply_to=granted.reply_to,
                attempt_id=offer.attempt_id,
                lease_deadline_ms=rig.now_ms() + TEST_CONFIG.lease_ms,
            )
            await trio.sleep(LEASE_S * 0.8)
            renewed = await worker.renew(offer)
            assert isinstance(renewed, Granted)
            assert renewed.lease_deadline_ms == rig.now_ms() + TEST_CONFIG.lease_ms
            await trio.sleep(LEASE_S * 0.5)  # past the first deadline, within the renewed one
            recorded = await worker.finish(offer, Succeeded(result='{"width": 640}'))
            assert recorded.disposition is Disposition.ACCEPTED  # type: ignore[union-attr]
        task = await rig.task(token, submitted["task_id"])
    assert task["state"] == "SUCCEEDED"
    assert task["result"] == {"width": 640}
    assert [(a["epoch"], a["state"]) for a in task["attempts"]] == [(1, "SUCCEEDED")]
    assert kinds(task) == ["SUBMITTED", "OFFERED", "STARTED", "SUCCEEDED", "SUCCEEDED"]
    assert task["evidence"] == []


async def test_a_lapsed_lease_is_retried_as_a_new_attempt_with_a_new_epoch(
    hub_url: str, autojump_clock: trio.testing.MockClock
) -> None:
    async with running_hub(hub_url) as rig:
        token = rig.credential()
        submitted = await rig.submit(token, idempotency="IDEMPOTENT", max_attempts=3)
        async with rig.worker(token) as worker:
            first = await worker.claim()
            started_ms = rig.now_ms()
            second = await worker.offer()  # after the lease ran out and the back-off passed
            assert rig.now_ms() >= started_ms + TEST_CONFIG.lease_ms + TEST_CONFIG.retry_backoff_ms
            assert (second.epoch, second.task_id) == (2, first.task_id)
            assert second.attempt_id != first.attempt_id
            # The old epoch cannot speak for the new attempt, nor end the task.
            stale = await worker.request(
                Finish(
                    message_id=worker.next_id(),
                    attempt_id=second.attempt_id,
                    epoch=first.epoch,
                    outcome=Succeeded(result="1"),
                )
            )
            assert isinstance(stale, Refused)
            assert stale.code is RefusalCode.UNKNOWN_ATTEMPT
            late = await worker.finish(first, Succeeded(result='"old"'))
            assert late.disposition is Disposition.EVIDENCE_ONLY  # type: ignore[union-attr]
            await worker.start(second)
            done = await worker.finish(second, Succeeded(result='"new"'))
            assert done.disposition is Disposition.ACCEPTED  # type: ignore[union-attr]
        task = await rig.task(token, submitted["task_id"])
    assert task["state"] == "SUCCEEDED"
    assert task["result"] == "new"
    assert [(a["epoch"], a["state"]) for a in task["attempts"]] == [
        (1, "LEASE_EXPIRED"),
        (2, "SUCCEEDED"),
    ]
    assert task["started_attempts"] == 2
    assert task["uncertain"] is True
    assert [e["detail"]["result"] for e in task["evidence"]] == ["old"]


async def test_unknown_outcome_of_a_non_idempotent_task_needs_review(
    hub_url: str, autojump_clock: trio.testing.MockClock
) -> None:
    async with running_hub(hub_url) as rig:
        token = rig.credential()
        submitted = await rig.submit(token, max_attempts=5)  # not idempotent by default
        async with rig.worker(token) as worker:
            offer = await worker.claim()
            recorded = await worker.finish(offer, Unknown(code="CONNECTION_RESET"))
            assert recorded.disposition is Disposition.ACCEPTED  # type: ignore[union-attr]
            await worker.listen(60)
            assert worker.offers == []  # never run again, whatever the attempts left
        task = await rig.task(token, submitted["task_id"])
    assert task["state"] == "NEEDS_REVIEW"
    assert task["failure"] == {"code": "CONNECTION_RESET", "details": None}
    assert len(task["attempts"]) == 1


async def test_a_lapsed_lease_of_a_non_idempotent_task_needs_review(
    hub_url: str, autojump_clock: trio.testing.MockClock
) -> None:
    async with running_hub(hub_url) as rig:
        token = rig.credential()
        submitted = await rig.submit(token, max_attempts=5)
        async with rig.worker(token) as worker:
            await worker.claim()
            await worker.listen(LEASE_S * 3)
            assert worker.offers == []
        task = await rig.task(token, submitted["task_id"])
    assert task["state"] == "NEEDS_REVIEW"
    assert task["failure"]["code"] == "LEASE_EXPIRED"
    assert [a["state"] for a in task["attempts"]] == ["LEASE_EXPIRED"]


async def test_unknown_outcome_of_an_idempotent_task_is_retried_until_attempts_run_out(
    hub_url: str, autojump_clock: trio.testing.MockClock
) -> None:
    async with running_hub(hub_url) as rig:
        token = rig.credential()
        submitted = await rig.submit(token, idempotency="IDEMPOTENT", max_attempts=2)
        async with rig.worker(token) as worker:
            for epoch in (1, 2):
                offer = await worker.claim()
                assert offer.epoch == epoch
                await worker.finish(offer, Unknown(code="WORKER_LOST"))
            await worker.listen(60)
            assert worker.offers == []
        task = await rig.task(token, submitted["task_id"])
    assert task["state"] == "FAILED"
    assert task["failure"]["code"] == "WORKER_LOST"
    assert [a["state"] for a in task["attempts"]] == ["UNKNOWN", "UNKNOWN"]


async def test_a_late_report_is_evidence_only(
    hub_url: str, autojump_clock: trio.testing.MockClock
) -> None:
    async with running_hub(hub_url) as rig:
        token = rig.credential()
        submitted = await rig.submit(token)
        async with rig.worker(token) as worker:
            offer = await worker.claim()
            await trio.sleep(LEASE_S + 0.001)  # the report races the sweeper: either way
            recorded = await worker.finish(offer, Succeeded(result='{"done": true}'))
            assert recorded.disposition is Disposition.EVIDENCE_ONLY  # type: ignore[union-attr]
            again = await worker.finish(offer, Failed(code="LATE", details='{"x": 1}'))
            assert again.disposition is Disposition.EVIDENCE_ONLY  # type: ignore[union-attr]
        task = await rig.task(token, submitted["task_id"])
    assert task["state"] == "NEEDS_REVIEW"
    assert task["result"] is None
    assert [a["state"] for a in task["attempts"]] == ["LEASE_EXPIRED"]
    assert [e["detail"] for e in task["evidence"]] == [
        {"reported": "SUCCEEDED", "result": {"done": True}},
        {"reported": "FAILED", "code": "LATE", "details": {"x": 1}, "retryable": False},
    ]


async def test_a_report_contradicting_an_ended_attempt_is_evidence_only(
    hub_url: str, autojump_clock: trio.testing.MockClock
) -> None:
    async with running_hub(hub_url) as rig:
        token = rig.credential()
        submitted = await rig.submit(token)
        async with rig.worker(token) as worker:
            offer = await worker.claim()
            await worker.finish(offer, Failed(code="BAD_INPUT"))
            contradiction = await worker.finish(offer, Succeeded(result="1"))
            assert contradiction.disposition is Disposition.EVIDENCE_ONLY  # type: ignore[union-attr]
        task = await rig.task(token, submitted["task_id"])
    assert (task["state"], task["failure"]["code"], task["result"]) == ("FAILED", "BAD_INPUT", None)
    assert len(task["evidence"]) == 1


async def test_a_repeated_message_id_gets_the_same_answer(
    hub_url: str, autojump_clock: trio.testing.MockClock
) -> None:
    async with running_hub(hub_url) as rig:
        token = rig.credential()
        submitted = await rig.submit(token)
        async with rig.worker(token) as worker:
            offer = await worker.offer()
            start = Start(message_id="start-1", attempt_id=offer.attempt_id, epoch=offer.epoch)
            first = await worker.request(start)
            await trio.sleep(3)
            assert await worker.request(start) == first  # the same lease deadline, not a new one
            finish = worker.finish_message(offer, Succeeded(result="42"))
            await worker.send(finish, finish)  # pipelined in one frame
            answers = [await worker.answer(finish.message_id) for _ in range(2)]
        async with rig.worker(token) as again:  # the same instance, after a reconnect
            resent = await again.request(finish)
        task = await rig.task(token, submitted["task_id"])
    assert answers[0] == answers[1] == resent
    assert answers[0].disposition is Disposition.ACCEPTED  # type: ignore[union-attr]
    assert kinds(task).count("SUCCEEDED") == 2  # the attempt's end and the task's, once each
    assert task["evidence"] == []


async def test_a_message_id_reused_for_another_message_ends_the_connection(
    hub_url: str, autojump_clock: trio.testing.MockClock
) -> None:
    async with running_hub(hub_url) as rig:
        token = rig.credential()
        await rig.submit(token)
        async with rig.worker(token) as worker:
            offer = await worker.offer()
            await worker.request(
                Start(message_id="x", attempt_id=offer.attempt_id, epoch=offer.epoch)
            )
            await worker.send(
                Finish(
                    message_id="x",
                    attempt_id=offer.attempt_id,
                    epoch=offer.epoch,
                    outcome=Succeeded(result="1"),
                )
            )
            error = await worker.closed()
    assert error is not None
    assert error.code is ErrorCode.MESSAGE_ID_REUSED


async def test_work_is_offered_only_on_an_exact_capability(
    hub_url: str, autojump_clock: trio.testing.MockClock
) -> None:
    async with running_hub(hub_url) as rig:
        token = rig.credential()
        submitted = await rig.submit(token)
        async with rig.worker(token, instance_id="newer", capabilities=(OTHER_CAPABILITY,)) as w:
            await w.listen(30)
            assert w.offers == []
            async with rig.worker(token, instance_id="exact") as exact:
                offer = await exact.offer()
                assert offer.task_id == submitted["task_id"]
                await exact.listen(1)
            assert w.offers == []


async def test_credentials_of_another_queue_are_refused(
    hub_url: str, autojump_clock: trio.testing.MockClock
) -> None:
    async with running_hub(hub_url) as rig:
        token = rig.credential()
        await rig.submit(token)
        create_queue(rig.store, "q2", rig.now_ms())
        other = rig.credential("q2", Right.WORKER, Right.PRODUCER)
        async with rig.connected(other) as client:
            await client.send(
                OpenSession(
                    message_id="open",
                    instance_id="w9",
                    queue_id="q1",
                    capabilities=(CAPABILITY,),
                    capacity=4,
                )
            )
            error = await client.closed()
            assert client.offers == []
        status, body = await rig.http(
            "POST", "/v1/queues/q1/tasks", token=other, body={"handler": "h"}
        )
        listed, _ = await rig.http("GET", "/v1/queues/q1/tasks", token=other)
    assert error is not None
    assert error.code is ErrorCode.PERMISSION_DENIED
    assert "q1" in error.message
    assert (status, listed) == (403, 403)
    assert "q1" in body["error"]


async def test_a_worker_is_offered_no_more_than_its_capacity(
    hub_url: str, autojump_clock: trio.testing.MockClock
) -> None:
    async with running_hub(hub_url) as rig:
        token = rig.credential()
        for n in range(5):
            await rig.submit(token, payload={"n": n})
        async with rig.worker(token, capacity=2) as worker:
            await worker.listen(1)
            assert [o.payload for o in worker.offers] == ['{"n": 0}', '{"n": 1}']
            first = await worker.claim()
            await worker.finish(first, Succeeded(result="0"))
            await worker.listen(1)
            assert [o.payload for o in worker.offers] == ['{"n": 1}', '{"n": 2}']
            await worker.send(Heartbeat(capacity=0))
            await worker.listen(1)
            for offer in list(worker.offers):
                await worker.start(offer)
                await worker.finish(offer, Succeeded(result="1"))
            worker.offers.clear()
            await worker.listen(2)
            assert worker.offers == []


async def test_a_task_submitted_to_a_waiting_worker_is_offered_in_the_submissions_commit(
    hub_url: str, autojump_clock: trio.testing.MockClock
) -> None:
    async with running_hub(hub_url) as rig:
        token = rig.credential()
        async with rig.worker(token, capacity=1) as worker:
            await trio.testing.wait_all_tasks_blocked()
            before = rig.hub.committer.batches
            task = await rig.submit(token, payload={"n": 1})
            offer = await worker.offer()
            committed = rig.hub.committer.batches - before
    assert offer.task_id == task["task_id"]
    assert committed == 1


async def test_the_offer_that_takes_a_finished_attempts_place_shares_the_finishs_commit(
    hub_url: str, autojump_clock: trio.testing.MockClock
) -> None:
    async with running_hub(hub_url) as rig:
        token = rig.credential()
        for n in range(3):
            await rig.submit(token, payload={"n": n})
        async with rig.worker(token, capacity=1) as worker:
            first = await worker.claim()
            await trio.testing.wait_all_tasks_blocked()
            before = rig.hub.committer.batches
            finish = worker.finish_message(first, Succeeded(result="0"))
            await worker.send(finish)
            recorded = await worker.answer(finish.message_id)
            second = await worker.offer()
            committed = rig.hub.committer.batches - before
            await worker.listen(1)
            more = list(worker.offers)
            late = await worker.request(worker.finish_message(first, Succeeded(result="0")))
            await worker.listen(1)
    assert recorded == Recorded(
        reply_to=finish.message_id, attempt_id=first.attempt_id, disposition=Disposition.ACCEPTED
    )
    assert second.payload == '{"n": 1}'
    assert committed == 1
    assert more == []  # capacity 1: the place was filled once
    assert late == Recorded(
        reply_to=late.reply_to, attempt_id=first.attempt_id, disposition=Disposition.EVIDENCE_ONLY
    )
    assert worker.offers == []  # evidence frees no place


async def test_a_reader_waiting_for_a_task_is_answered_by_the_commit_that_ends_it(
    hub_url: str, autojump_clock: trio.testing.MockClock
) -> None:
    async with running_hub(hub_url) as rig:
        token = rig.credential()
        waited = await rig.submit(token, payload={"n": 1})
        never = await rig.submit(token, payload={"n": 2}, handler="nobody")
        answers: dict[str, tuple[float, dict[str, object]]] = {}

        async def read(name: str, task_id: str, wait_ms: int) -> None:
            target = f"/v1/tasks/{task_id}?wait_ms={wait_ms}"
            status, task = await rig.http("GET", target, token=token)
            assert status == 200
            answers[name] = (trio.current_time(), task)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(read, "waited", waited["task_id"], 10_000)
            nursery.start_soon(read, "never", never["task_id"], 3_000)
            async with rig.worker(token) as worker:
                offer = await worker.claim()
                await trio.sleep(2)
                await worker.finish(offer, Succeeded(result='"done"'))
        bad = await rig.http("GET", f"/v1/tasks/{never['task_id']}?wait_ms=30001", token=token)
        nobody = await rig.http("GET", f"/v1/tasks/{never['task_id']}?wait_ms=1")
    assert answers["waited"][0] == 2.0  # the finish's commit, not a poll later
    assert answers["waited"][1]["state"] == "SUCCEEDED"
    assert answers["never"][0] == 3.0
    assert answers["never"][1]["state"] == "QUEUED"
    assert (bad[0], bad[1]["field"]) == (400, "wait_ms")
    assert nobody[0] == 401


async def test_an_offer_not_started_in_time_is_withdrawn_and_offered_again(
    hub_url: str, autojump_clock: trio.testing.MockClock
) -> None:
    async with running_hub(hub_url) as rig:
        token = rig.credential()
        submitted = await rig.submit(token, max_attempts=1)
        async with rig.worker(token) as worker:
            ignored = await worker.offer()
            again = await worker.offer()
            assert rig.now_ms() >= EPOCH_MS + TEST_CONFIG.offer_ttl_ms
            assert again.epoch == ignored.epoch + 1
            refused = await worker.start(ignored)
            assert isinstance(refused, Refused)
            assert refused.code is RefusalCode.NOT_OFFERED
            await worker.start(again)
            await worker.finish(again, Succeeded(result="true"))
        task = await rig.task(token, submitted["task_id"])
    assert task["state"] == "SUCCEEDED"  # withdrawing used none of its one attempt
    assert [a["state"] for a in task["attempts"]] == ["WITHDRAWN", "SUCCEEDED"]


async def test_a_retryable_failure_is_retried_and_a_final_one_fails_the_task(
    hub_url: str, autojump_clock: trio.testing.MockClock
) -> None:
    async with running_hub(hub_url) as rig:
        token = rig.credential()
        submitted = await rig.submit(token, max_attempts=3)
        async with rig.worker(token) as worker:
            offer = await worker.claim()
            await worker.finish(offer, Failed(code="BUSY", retryable=True))
            offer = await worker.claim()
            await worker.finish(offer, Failed(code="BAD_IMAGE", details='{"pixel": 3}'))
            await worker.listen(30)
            assert worker.offers == []
        task = await rig.task(token, submitted["task_id"])
    assert task["state"] == "FAILED"
    assert task["failure"] == {"code": "BAD_IMAGE", "details": {"pixel": 3}}
    assert task["uncertain"] is False


async def test_a_task_past_its_deadline_in_the_queue_fails(
    hub_url: str, autojump_clock: trio.testing.MockClock
) -> None:
    async with running_hub(hub_url) as rig:
        token = rig.credential()
        submitted = await rig.submit(token, total_deadline_ms=5_000)
        await trio.sleep(6)
        task = await rig.task(token, submitted["task_id"])
    assert task["state"] == "FAILED"
    assert task["failure"]["code"] == "DEADLINE_EXCEEDED"
    assert task["finished_at_ms"] == EPOCH_MS + 5_000


async def test_bad_reports_are_refused_and_the_attempt_may_report_again(
    hub_url: str, autojump_clock: trio.testing.MockClock
) -> None:
    async with running_hub(hub_url) as rig:
        token = rig.credential()
        submitted = await rig.submit(token)
        async with rig.worker(token) as worker:
            offer = await worker.offer()
            not_started = await worker.finish(offer, Succeeded(result="1"))
            await worker.start(offer)
            huge = await worker.finish(offer, Succeeded(result='"' + "x" * MAX_JSON_BYTES + '"'))
            not_json = await worker.finish(offer, Succeeded(result="{oops"))
            bad_code = await worker.finish(offer, Failed(code="lower case"))
            good = await worker.finish(offer, Succeeded(result="[1, 2]"))
        task = await rig.task(token, submitted["task_id"])
    codes = [getattr(a, "code", None) for a in (not_started, huge, not_json, bad_code)]
    assert codes == [
        RefusalCode.NOT_STARTED,
        RefusalCode.TOO_LARGE,
        RefusalCode.INVALID_REPORT,
        RefusalCode.INVALID_REPORT,
    ]
    assert "bytes" in huge.message  # type: ignore[union-attr]
    assert good.disposition is Disposition.ACCEPTED  # type: ignore[union-attr]
    assert task["result"] == [1, 2]


async def test_a_reconnected_worker_resumes_the_attempts_it_holds(
    hub_url: str, autojump_clock: trio.testing.MockClock
) -> None:
    async with running_hub(hub_url) as rig:
        token = rig.credential()
        await rig.submit(token)
        async with rig.worker(token, capacity=1) as worker:
            offer = await worker.offer()
            granted = await worker.start(offer)
        await trio.sleep(2)
        async with rig.worker(token, capacity=1) as back:
            resumed = await back.request(
                Resume(
                    message_id=back.next_id(),
                    attempts=(
                        AttemptRef(attempt_id=offer.attempt_id, epoch=offer.epoch),
                        AttemptRef(attempt_id="never-heard-of", epoch=1),
                        AttemptRef(attempt_id=offer.attempt_id, epoch=offer.epoch + 1),
                    ),
                )
            )
            assert isinstance(resumed, Resumed)
            assert [(r.status, r.lease_deadline_ms) for r in resumed.attempts] == [
                (AttemptStatus.RUNNING, granted.lease_deadline_ms),  # type: ignore[union-attr]
                (AttemptStatus.LOST, 0),
                (AttemptStatus.LOST, 0),
            ]
            renewed = await back.renew(offer)
            assert isinstance(renewed, Granted)
            await back.listen(1)
            assert back.offers == []  # its one place is taken by the resumed attempt
            done = await back.finish(offer, Succeeded(result="1"))
    assert done.disposition is Disposition.ACCEPTED  # type: ignore[union-attr]


async def test_drain_stops_offers_and_names_the_offered_attempts(
    hub_url: str, autojump_clock: trio.testing.MockClock
) -> None:
    async with running_hub(hub_url) as rig:
        token = rig.credential()
        for _ in range(3):
            await rig.submit(token)
        async with rig.worker(token, capacity=2) as worker:
            await worker.listen(1)
            first, second = worker.offers
            await worker.start(first)
            ack = await worker.request(Drain(message_id="drain"))
            assert ack == DrainAck(reply_to="drain", offered=(second.attempt_id,))
            await worker.finish(first, Succeeded(result="1"))
            await worker.listen(30)
            assert worker.offers == [first, second]  # nothing new
