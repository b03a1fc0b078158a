"""Operating a hub: credentials revoked, queues paused, ended tasks deleted after their
retention; on SQLite and on PostgreSQL (`hub_url`), on Trio's virtual clock.

A second hub on the same database stands for every other hub and for the
commands, which change the database directly: what one does, the others see.
"""

from __future__ import annotations

import attrs
import trio
import trio.testing

from blockx.hub import (
    Right,
    Store,
    TaskState,
    pause_queue,
    revoke_credential,
    show_credentials,
    show_queues,
)
from blockx.hub._ops import forget_tasks, sweep
from blockx.hubwire import PROTOCOL_VERSION, ErrorCode, Failed, Hello, Succeeded, Unknown
from tests.adapters.hub_harness import EPOCH_MS, QUEUE, TEST_CONFIG, HubClient, running_hub
from tests.adapters.test_hub_store import TIMING, queue_tasks

RETENTION_MS = 10_000
RETAINING = attrs.evolve(TEST_CONFIG, task_retention_ms=RETENTION_MS, receipt_retention_ms=5_000)


def credential_id(token: str) -> str:
    return token.removeprefix("bxc_").partition(".")[0]


def rows_of(store: Store, table: str, task_id: str) -> int:
    sql = f"SELECT COUNT(*) FROM {table} WHERE task_id = ?"
    return int(store.read(lambda tx: tx.rows(sql, task_id))[0][0])


async def test_a_revoked_credential_is_refused_at_once_and_its_sessions_close_on_every_hub(
    hub_url: str, autojump_clock: trio.testing.MockClock
) -> None:
    async with running_hub(hub_url) as rig, running_hub(hub_url) as other:
        admin = rig.credential("*", Right.ADMIN)
        token = rig.credential()
        kept = rig.credential()
        async with other.worker(token) as worker, other.worker(kept, instance_id="w2") as peer:
            status, revoked = await rig.http(
                "POST", f"/v1/credentials/{credential_id(token)}:revoke", token=admin
            )
            refused, _ = await other.http("GET", f"/v1/queues/{QUEUE}/tasks", token=token)
            started = trio.current_time()
            error = await worker.closed()
            closed_after_s = trio.current_time() - started
            await peer.listen(5)
            assert peer.socket.closed is None  # another credential's session stays
        async with other.open_socket() as socket:
            again = HubClient(socket=socket)
            await again.send(Hello(protocol_version=PROTOCOL_VERSION, credential=token))
            hello_error = await again.closed()
        unknown, _ = await rig.http("POST", "/v1/credentials/nope:revoke", token=admin)
    assert (status, revoked["revoked"], revoked["credential_id"]) == (
        200,
        True,
        credential_id(token),
    )
    assert refused == 401
    assert error is not None
    assert error.code is ErrorCode.AUTH_FAILED
    assert closed_after_s <= 1.0
    assert hello_error is not None
    assert hello_error.code is ErrorCode.AUTH_FAILED
    assert unknown == 404


async def test_a_revocation_by_command_closes_the_sessions_within_a_second(
    hub_url: str, autojump_clock: trio.testing.MockClock
) -> None:
    async with running_hub(hub_url) as rig:
        token = rig.credential()
        async with rig.worker(token) as worker:
            assert revoke_credential(rig.store, credential_id(token))
            with trio.fail_after(1):
                error = await worker.closed()
        listed = show_credentials(rig.store)
        unknown = revoke_credential(rig.store, "nope")
    assert error is not None
    assert error.code is ErrorCode.AUTH_FAILED
    assert [(c["credential_id"], c["revoked"]) for c in listed] == [(credential_id(token), True)]
    assert set(listed[0]) == {"credential_id", "queue_id", "rights", "revoked", "created_at_ms"}
    assert not unknown


async def test_a_paused_queue_takes_submissions_and_offers_nothing_until_resumed(
    hub_url: str, autojump_clock: trio.testing.MockClock
) -> None:
    async with running_hub(hub_url) as rig, running_hub(hub_url) as other:
        token = rig.credential()
        pause_queue(rig.store, QUEUE, True)  # as `blockx hub queue pause` does
        submitted = [await rig.submit(token, payload={"n": n}) for n in range(2)]
        async with rig.worker(token) as worker, other.worker(token, instance_id="w2") as peer:
            await worker.listen(5)
            await peer.listen(0.1)
            paused = (list(worker.offers), list(peer.offers))
            await trio.sleep(3)
            queues = show_queues(rig.store, rig.now_ms())
            pause_queue(other.store, QUEUE, False)
            await worker.listen(1)
            await peer.listen(0.1)
            offered = sorted(offer.task_id for offer in [*worker.offers, *peer.offers])
    assert paused == ([], [])
    assert [(q["queue_id"], q["paused"]) for q in queues] == [(QUEUE, True)]
    assert queues[0]["tasks"][TaskState.QUEUED] == 2
    assert queues[0]["oldest_queued_age_ms"] >= 8_000
    assert offered == sorted(task["task_id"] for task in submitted)


async def test_the_admin_api_lists_pauses_and_refuses_those_without_the_admin_right(
    hub_url: str, autojump_clock: trio.testing.MockClock
) -> None:
    async with running_hub(hub_url) as rig:
        admin = rig.credential("*", Right.ADMIN)
        producer = rig.credential()
        await rig.submit(producer)
        paused = await rig.http("POST", f"/v1/queues/{QUEUE}:pause", token=admin)
        listed = await rig.http("GET", "/v1/queues", token=admin)
        resumed = await rig.http("POST", f"/v1/queues/{QUEUE}:resume", token=admin)
        credentials = await rig.http("GET", "/v1/credentials", token=admin)
        refused = [
            (await rig.http(method, target, token=who))[0]
            for method, target, who in [
                ("GET", "/v1/queues", producer),
                ("GET", "/v1/credentials", None),
                ("GET", f"/v1/queues/{QUEUE}:pause", admin),
                ("POST", "/v1/queues/nope:pause", admin),
            ]
        ]
    assert (paused[0], paused[1]["paused"], resumed[1]["paused"]) == (200, True, False)
    assert listed[1]["queues"][0]["tasks"]["QUEUED"] == 1
    assert listed[1]["queues"][0]["running"] == 0
    assert sorted(c["rights"] for c in credentials[1]["credentials"]) == [
        ["admin"],
        ["producer", "worker"],
    ]
    assert "secret" not in repr(credentials[1])
    assert producer not in repr(credentials[1])
    assert refused == [403, 401, 405, 404]


async def test_retention_deletes_an_ended_task_with_its_attempts_history_and_evidence(
    hub_url: str, autojump_clock: trio.testing.MockClock
) -> None:
    async with running_hub(hub_url, RETAINING) as rig:
        token = rig.credential()
        ended = await rig.submit(token, idempotency="IDEMPOTENT", max_attempts=1)
        async with rig.worker(token) as worker:
            first = await worker.claim()
            await trio.sleep(TEST_CONFIG.lease_ms / 1000 + 1)  # its lease runs out: FAILED
            late = await worker.finish(first, Succeeded(result="1"))  # evidence only
            review = await rig.submit(token)  # not idempotent: an unknown outcome needs review
            second = await worker.claim()
            await worker.finish(second, Unknown(code="LOST"))
            before = await rig.task(token, ended["task_id"])
            counts_before = [
                rows_of(rig.store, t, ended["task_id"]) for t in ("attempts", "history")
            ]
            await trio.sleep(RETENTION_MS / 1000 + 2)
            await worker.finish(first, Failed(code="AFTER"))  # nothing to record it on now
        gone, body = await rig.http("GET", f"/v1/tasks/{ended['task_id']}", token=token)
        kept = await rig.task(token, review["task_id"])
        counts_after = [rows_of(rig.store, t, ended["task_id"]) for t in ("attempts", "history")]
        receipts = rig.store.read(lambda tx: tx.rows("SELECT COUNT(*) FROM receipts"))[0][0]
    assert late.disposition.value == "EVIDENCE_ONLY"  # type: ignore[union-attr]
    assert before["state"] == "FAILED"
    assert len(before["evidence"]) == 1
    assert counts_before[0] == 1
    assert counts_before[1] >= 4
    assert (gone, body["error"]) == (404, f"no task {ended['task_id']!r}")
    assert counts_after == [0, 0]
    assert kept["state"] == "NEEDS_REVIEW"  # it waits for a person, however long
    assert receipts <= 1  # only the last finish's answer is younger than its retention


def test_retention_deletes_in_batches_the_oldest_first(hub_url: str) -> None:
    store = Store(hub_url)
    try:
        queue_tasks(store, 1_100)  # submitted at 0 ms to 1,099 ms, due within the hour
        store.read(sweep(EPOCH_MS, TIMING, 2_000))  # all past their deadline: FAILED now
        late = EPOCH_MS + 1
        store.read(
            lambda tx: tx.run("UPDATE tasks SET finished_at_ms = ? WHERE payload = '7'", late)
        )
        batches = [store.read(forget_tasks(EPOCH_MS + 1, 500)) for _ in range(4)]
        left = store.read(lambda tx: tx.rows("SELECT payload, state FROM tasks"))
        history = store.read(lambda tx: tx.rows("SELECT COUNT(*) FROM history"))[0][0]
    finally:
        store.close()
    assert batches == [500, 500, 99, 0]
    assert left == [("7", "FAILED")]
    assert history == 2  # its submission and its failure


async def test_the_admin_api_sets_a_concurrency_keys_limit(
    hub_url: str, autojump_clock: trio.testing.MockClock
) -> None:
    async with running_hub(hub_url) as rig:
        admin = rig.credential("*", Right.ADMIN)
        token = rig.credential()
        limited = await rig.http(
            "POST", f"/v1/queues/{QUEUE}:limit?key=acct%207&max_running=1", token=admin
        )
        for n in range(3):
            await rig.submit(token, payload=n, concurrency_key="acct 7")
        async with rig.worker(token, capacity=8) as worker:
            await worker.listen(1)
            offered = [o.payload for o in worker.offers]
        removed = await rig.http(
            "POST", f"/v1/queues/{QUEUE}:limit?key=acct%207&max_running=0", token=admin
        )
        refused = [
            (await rig.http("POST", target, token=who))[0]
            for target, who in [
                (f"/v1/queues/{QUEUE}:limit?max_running=x", admin),
                (f"/v1/queues/{QUEUE}:limit?max_running=1000001", admin),
                ("/v1/queues/nope:limit?max_running=1", admin),
                (f"/v1/queues/{QUEUE}:limit?max_running=1", token),
            ]
        ]
    assert limited == (200, {"queue_id": QUEUE, "key": "acct 7", "max_running": 1})
    assert offered == ["0"]  # one live attempt of the key at a time
    assert removed[1]["max_running"] == 0
    assert refused == [400, 400, 404, 403]
