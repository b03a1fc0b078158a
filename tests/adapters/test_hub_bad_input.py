"""What the hub does with bad input: malformed frames, wrong order, bad credentials, bad requests.

A worker that breaks the protocol gets an `Error` naming what is wrong and
its connection is closed; the hub carries on serving everyone else. A
producer's bad request gets a 4xx naming the field. On SQLite and PostgreSQL.
"""

from __future__ import annotations

import attrs
import h11
import msgpack  # type: ignore[import-untyped]  # ships no type information
import pytest
import trio
import trio.testing

from blockx.hub import Right
from blockx.hubwire import (
    MAX_FRAME_BYTES,
    MAX_FRAME_MESSAGES,
    MAX_JSON_BYTES,
    PROTOCOL_VERSION,
    Disposition,
    ErrorCode,
    Hello,
    OpenSession,
    RefusalCode,
    Start,
    Succeeded,
    encode,
)
from tests.adapters.hub_harness import CAPABILITY, TEST_CONFIG, HubClient, HubRig, running_hub


async def still_serves(rig: HubRig, token: str) -> None:
    """A task submitted now is claimed and finished by a new worker."""
    task = await rig.submit(token, payload={"after": "the bad one"})
    async with rig.worker(token, instance_id="healthy") as worker:
        offer = await worker.claim()
        assert offer.task_id == task["task_id"]
        recorded = await worker.finish(offer, Succeeded(result="1"))
    assert recorded.disposition is Disposition.ACCEPTED  # type: ignore[union-attr]


OPEN = OpenSession(
    message_id="open", instance_id="w1", queue_id="q1", capabilities=(CAPABILITY,), capacity=1
)
BAD_SESSION_FRAMES = {
    "text frame": "[]",
    "not msgpack": b"\xc1\xc1\xc1",
    "not an array": msgpack.packb({"type": "start"}),
    "empty array": msgpack.packb([]),
    "not a map": msgpack.packb([7]),
    "unknown type": msgpack.packb([{"type": "steal", "message_id": "x"}]),
    "missing field": msgpack.packb([{"type": "start", "message_id": "x", "epoch": 1}]),
    "extra field": msgpack.packb(
        [{"type": "drain", "message_id": "x", "please": True}],
    ),
    "wrong type": msgpack.packb(
        [{"type": "start", "message_id": "x", "attempt_id": "a", "epoch": "1"}]
    ),
    "empty message id": msgpack.packb([{"type": "drain", "message_id": ""}]),
    "negative capacity": msgpack.packb([{"type": "heartbeat", "capacity": -1}]),
    "hub's message": msgpack.packb([{"type": "welcome", "protocol_version": 1, "hub_id": "x"}]),
    "second session": encode([OPEN]),
    "second hello": encode([Hello(protocol_version=PROTOCOL_VERSION, credential="x")]),
}


@pytest.mark.parametrize("frame", BAD_SESSION_FRAMES.values(), ids=BAD_SESSION_FRAMES.keys())
async def test_a_malformed_frame_closes_the_connection_with_a_protocol_error(
    hub_url: str, frame: bytes | str, autojump_clock: trio.testing.MockClock
) -> None:
    async with running_hub(hub_url) as rig:
        token = rig.credential()
        async with rig.worker(token) as worker:
            await worker.socket.send_message(frame)
            error = await worker.closed()
        assert error is not None
        assert error.code is ErrorCode.PROTOCOL_ERROR
        assert error.message
        await still_serves(rig, token)


async def test_a_message_before_the_session_is_a_protocol_error(
    hub_url: str, autojump_clock: trio.testing.MockClock
) -> None:
    async with running_hub(hub_url) as rig:
        token = rig.credential()
        async with rig.connected(token) as client:
            await client.send(Start(message_id="s", attempt_id="a", epoch=1))
            error = await client.closed()
        assert error is not None
        assert (error.code, error.message) == (
            ErrorCode.PROTOCOL_ERROR,
            "Start before open_session",
        )
        await still_serves(rig, token)


@pytest.mark.parametrize(
    ("hello", "code"),
    [
        (encode([OPEN]), ErrorCode.PROTOCOL_ERROR),
        (encode([Hello(protocol_version=PROTOCOL_VERSION + 1, credential="")]), None),
        (encode([Hello(protocol_version=PROTOCOL_VERSION, credential="bxc_no.such")]), None),
        (b"\x92", ErrorCode.PROTOCOL_ERROR),
    ],
    ids=["no hello", "another version", "unknown credential", "truncated"],
)
async def test_a_bad_hello_is_answered_with_an_error(
    hub_url: str, hello: bytes, code: ErrorCode | None, autojump_clock: trio.testing.MockClock
) -> None:
    async with running_hub(hub_url) as rig:
        token = rig.credential()
        async with rig.open_socket() as socket:
            client = HubClient(socket=socket)
            await socket.send_message(hello)
            error = await client.closed()
        assert error is not None
        expected = code or (
            ErrorCode.VERSION_MISMATCH if b"bxc_" not in hello else ErrorCode.AUTH_FAILED
        )
        assert error.code is expected
        await still_serves(rig, token)


async def test_a_silent_worker_is_closed_after_the_session_ttl(
    hub_url: str, autojump_clock: trio.testing.MockClock
) -> None:
    async with running_hub(hub_url, attrs.evolve(TEST_CONFIG, session_ttl_ms=3_000)) as rig:
        token = rig.credential()
        async with rig.worker(token) as worker:
            started = trio.current_time()
            error = await worker.closed()
            assert trio.current_time() - started == pytest.approx(3.0)
    assert error is not None
    assert error.code is ErrorCode.SESSION_EXPIRED


async def test_producer_requests_need_a_credential_with_the_right(
    hub_url: str, autojump_clock: trio.testing.MockClock
) -> None:
    async with running_hub(hub_url) as rig:
        worker_only = rig.credential("q1", Right.WORKER)
        admin = rig.credential("*", Right.ADMIN)
        body = {"handler": "h", "handler_version": "1", "payload_version": "1", "payload": 1}
        answers = [
            await rig.http("POST", "/v1/queues/q1/tasks", body=body),
            await rig.http("POST", "/v1/queues/q1/tasks", token="bxc_x.y", body=body),
            await rig.http("POST", "/v1/queues/q1/tasks", token=worker_only, body=body),
            await rig.http("POST", "/v1/queues/nope/tasks", token=admin, body=body),
            await rig.http("POST", "/v1/queues/q1/tasks", token=admin, body=body),
        ]
    assert [status for status, _ in answers] == [401, 401, 403, 404, 201]
    assert answers[3][1] == {"error": "no queue 'nope'", "field": "queue"}


async def test_a_producer_request_is_one_transaction_its_credential_check_included(
    hub_url: str, autojump_clock: trio.testing.MockClock
) -> None:
    async with running_hub(hub_url) as rig:
        token = rig.credential()
        worker_only = rig.credential("q1", Right.WORKER)
        body = {"handler": "h", "handler_version": "1", "payload_version": "1", "payload": 1}
        committed = []
        answers = []
        for method, target, who, document in [
            ("POST", "/v1/queues/q1/tasks", token, body),
            ("POST", "/v1/queues/q1/tasks", worker_only, body),
            ("POST", "/v1/queues/q1/tasks", None, {"not": "a submission"}),
            ("GET", "/v1/queues/q1/tasks?state=QUEUED", token, None),
            ("GET", "/v1/tasks/nope", token, None),
        ]:
            await trio.testing.wait_all_tasks_blocked()  # the start-up sweep is done
            before = rig.hub.committer.batches
            answers.append(await rig.http(method, target, token=who, body=document))
            committed.append(rig.hub.committer.batches - before)
    assert [status for status, _ in answers] == [201, 403, 401, 200, 404]
    assert committed == [1, 1, 1, 1, 1]


async def test_a_producer_connection_serves_request_after_request_until_it_must_close(
    hub_url: str, autojump_clock: trio.testing.MockClock
) -> None:
    async with running_hub(hub_url) as rig:
        token = rig.credential()
        stream = await rig.open_stream()
        client = h11.Connection(h11.CLIENT)
        answered = []
        for target in ("/v1/queues/q1/tasks", "/v1/tasks/nope", "/v1/worker"):
            headers = [("host", "hub.test"), ("authorization", f"Bearer {token}")]
            request = h11.Request(method="GET", target=target, headers=headers)
            await stream.send_all(client.send(request) + client.send(h11.EndOfMessage()))
            status, keep = 0, b""
            while not isinstance(event := client.next_event(), h11.EndOfMessage):
                if event is h11.NEED_DATA:
                    client.receive_data(bytes(await stream.receive_some()))
                elif isinstance(event, h11.Response):
                    status = event.status_code
                    keep = dict(event.headers).get(b"connection", b"")
            answered.append((status, keep))
            if client.their_state is h11.DONE:
                client.start_next_cycle()
        closed = await stream.receive_some()
    assert answered == [(200, b""), (404, b""), (400, b"close")]
    assert closed == b""  # the worker's path wants a connection of its own


BAD_SUBMISSIONS = {
    "handler": ({"handler_version": "1", "payload_version": "1", "payload": 1}, 400),
    "payload": ({"handler": "h", "handler_version": "1", "payload_version": "1"}, 400),
    "idempotency": ({"idempotency": "SOMETIMES"}, 400),
    "max_attempts": ({"max_attempts": 0}, 400),
    "total_deadline_ms": ({"total_deadline_ms": "soon"}, 400),
    "attempt_timeout_ms": ({"attempt_timeout_ms": True}, 400),
    "colour": ({"colour": "blue"}, 400),
    "priority": ({"priority": 10}, 400),
    "delay_ms": ({"delay_ms": 10, "run_at_ms": 1}, 400),
    "run_at_ms": ({"run_at_ms": 4_000_000_000_000}, 400),
    "concurrency_key": ({"concurrency_key": 7}, 400),
    "(body)": ([1, 2], 400),
}


@pytest.mark.parametrize("field", BAD_SUBMISSIONS)
async def test_a_bad_submission_is_answered_400_naming_the_field(
    hub_url: str, field: str, autojump_clock: trio.testing.MockClock
) -> None:
    document, status = BAD_SUBMISSIONS[field]
    if isinstance(document, dict) and field not in ("handler", "payload"):
        document = {
            "handler": "h",
            "handler_version": "1",
            "payload_version": "1",
            "payload": 1,
            **document,
        }
    async with running_hub(hub_url) as rig:
        token = rig.credential()
        answer = await rig.http("POST", "/v1/queues/q1/tasks", token=token, body=document)
        listed = await rig.http("GET", "/v1/queues/q1/tasks", token=token)
    assert answer[0] == status
    assert answer[1]["field"] == field
    assert field in answer[1]["error"]
    assert listed == (200, {"tasks": []})


async def test_bodies_that_are_not_json_or_too_large_are_refused(
    hub_url: str, autojump_clock: trio.testing.MockClock
) -> None:
    async with running_hub(hub_url) as rig:
        token = rig.credential()
        not_json = await rig.http("POST", "/v1/queues/q1/tasks", token=token, raw=b"{nope")
        huge = {"handler": "h", "handler_version": "1", "payload_version": "1"}
        too_large = await rig.http(
            "POST", "/v1/queues/q1/tasks", token=token, body={**huge, "payload": "x" * 2**20}
        )
        big_payload = await rig.http(
            "POST",
            "/v1/queues/q1/tasks",
            token=token,
            body={**huge, "payload": "x" * MAX_JSON_BYTES},
        )
    assert not_json[0] == 400
    assert not_json[1]["field"] == "(body)"
    assert too_large[0] == 413
    assert (big_payload[0], big_payload[1]["field"]) == (400, "payload")


async def test_task_ids_repeat_idempotently_and_conflict_on_other_content(
    hub_url: str, autojump_clock: trio.testing.MockClock
) -> None:
    async with running_hub(hub_url) as rig:
        token = rig.credential()
        first = await rig.submit(token, task_id="order-17")
        again = await rig.http(
            "POST",
            "/v1/queues/q1/tasks",
            token=token,
            body={
                "handler": CAPABILITY.handler,
                "handler_version": CAPABILITY.handler_version,
                "payload_version": CAPABILITY.payload_version,
                "payload": {"n": 1},
                "task_id": "order-17",
            },
        )
        other = await rig.http(
            "POST",
            "/v1/queues/q1/tasks",
            token=token,
            body={
                "handler": "h",
                "handler_version": "1",
                "payload_version": "1",
                "payload": 2,
                "task_id": "order-17",
            },
        )
        missing = await rig.http("GET", "/v1/tasks/order-18", token=token)
        wrong_method = await rig.http("DELETE", "/v1/queues/q1/tasks", token=token)
        unknown = await rig.http("GET", "/v2/everything", token=token)
        bad_state = await rig.http("GET", "/v1/queues/q1/tasks?state=DONE", token=token)
        queued = await rig.http("GET", "/v1/queues/q1/tasks?state=QUEUED&limit=5", token=token)
    assert first["task_id"] == "order-17"
    assert again == (200, first)
    assert (other[0], other[1]["field"]) == (409, "task_id")
    assert missing == (404, {"error": "no task 'order-18'"})
    assert [wrong_method[0], unknown[0], bad_state[0]] == [405, 404, 400]
    assert queued == (200, {"tasks": [first]})


async def test_a_flood_of_requests_is_answered_in_full_at_the_hubs_pace(
    hub_url: str, autojump_clock: trio.testing.MockClock
) -> None:
    async with running_hub(hub_url) as rig:
        token = rig.credential()
        async with rig.worker(token) as worker:
            starts = [
                Start(message_id=worker.next_id(), attempt_id=f"a{n}", epoch=1)
                for n in range(5 * MAX_FRAME_MESSAGES)
            ]
            for n in range(0, len(starts), MAX_FRAME_MESSAGES):
                await worker.send(*starts[n : n + MAX_FRAME_MESSAGES])
            answers = [await worker.answer(start.message_id) for start in starts]
        assert {getattr(answer, "code", None) for answer in answers} == {
            RefusalCode.UNKNOWN_ATTEMPT
        }
        await still_serves(rig, token)


async def test_a_message_above_the_frame_limit_closes_the_connection(
    hub_url: str, autojump_clock: trio.testing.MockClock
) -> None:
    async with running_hub(hub_url) as rig:
        token = rig.credential()
        async with rig.worker(token) as worker:
            await worker.socket.send_message(b"\x91" + b"\x00" * MAX_FRAME_BYTES)
            assert await worker.closed() is None
            assert worker.socket.closed is not None
            assert worker.socket.closed.code == 1009  # message too big
        await still_serves(rig, token)
