"""JSON through the hub: texts kept exactly, refusals naming the path, no recursion.

A payload is stored as the text the producer sent and served back as it is; a
payload, result or details that breaks the protocol's JSON rules is refused
naming the path of the offending value, and nothing is stored. On SQLite.
"""

from __future__ import annotations

from typing import Final

import pytest
import trio
import trio.testing

from blockx.hubwire import Failed, RefusalCode, Refused, Succeeded, object_members
from tests.adapters.autoworker_rig import SQLITE
from tests.adapters.hub_harness import CAPABILITY, QUEUE, running_hub

SUBMIT: Final = f"/v1/queues/{QUEUE}/tasks"


def body(payload: str) -> bytes:
    """A submission of `CAPABILITY` whose payload is the text `payload`, as it is."""
    return (
        f'{{"handler": "{CAPABILITY.handler}", "handler_version": "{CAPABILITY.handler_version}",'
        f' "payload_version": "{CAPABILITY.payload_version}", "payload": {payload}}}'
    ).encode()


@SQLITE
@pytest.mark.parametrize(
    ("payload", "path"),
    [
        ('{"x": NaN}', "payload.x"),
        ('{"items": [1, 2, 3, {"price": Infinity}]}', "payload.items[3].price"),
        ("[1e400]", "payload[0]"),
        ('{"n": 18446744073709551616}', "payload.n"),
        ('"\\ud800"', "payload"),
        ("[" * 100_000 + "]" * 100_000, "payload" + "[0]" * 64),
    ],
)
async def test_a_payload_that_breaks_the_json_rules_is_refused_naming_its_path(
    hub_url: str, autojump_clock: trio.testing.MockClock, payload: str, path: str
) -> None:
    async with running_hub(hub_url) as rig:
        token = rig.credential()
        status, answer = await rig.http("POST", SUBMIT, token=token, raw=body(payload))
        listed = await rig.http("GET", SUBMIT, token=token)
    assert (status, answer["field"]) == (400, path)
    assert path in answer["error"]
    assert listed == (200, {"tasks": []})


@SQLITE
async def test_a_body_nested_too_deep_is_refused_not_dropped(
    hub_url: str, autojump_clock: trio.testing.MockClock
) -> None:
    async with running_hub(hub_url) as rig:
        token = rig.credential()
        deep = b'{"handler": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
        status, answer = await rig.http("POST", SUBMIT, token=token, raw=deep)
        not_utf8 = await rig.http("POST", SUBMIT, token=token, raw=b'{"handler": "\xff"}')
    assert (status, answer["field"]) == (400, "handler" + "[0]" * 64)
    assert (not_utf8[0], not_utf8[1]["field"]) == (400, "(body)")


@SQLITE
async def test_payloads_and_results_come_back_as_the_texts_given(
    hub_url: str, autojump_clock: trio.testing.MockClock
) -> None:
    payload = '{"price": 1.10, "id": 1234567890123456789, "tiny": 1E-7, "zero": -0}'
    async with running_hub(hub_url) as rig:
        token = rig.credential()
        status, created = await rig.http_text("POST", SUBMIT, token=token, raw=body(payload))
        task_id = object_members(created)["task_id"].strip('"')
        async with rig.worker(token) as worker:
            offer = await worker.claim()
            refused = await worker.finish(offer, Succeeded(result='{"total": NaN}'))
            await worker.finish(
                offer, Succeeded(result='{"total": 2.50, "n": -9223372036854775808}')
            )
        read = await rig.http_text("GET", f"/v1/tasks/{task_id}", token=token)
    assert status == 201
    assert object_members(created)["payload"] == payload
    assert offer.payload == payload
    assert isinstance(refused, Refused)
    assert refused.code is RefusalCode.INVALID_REPORT
    assert refused.message.startswith("result.total: ")
    assert read[0] == 200
    shown = object_members(read[1])
    assert (shown["payload"], shown["result"]) == (
        payload,
        '{"total": 2.50, "n": -9223372036854775808}',
    )


@SQLITE
async def test_failure_details_are_checked_and_kept_as_given(
    hub_url: str, autojump_clock: trio.testing.MockClock
) -> None:
    async with running_hub(hub_url) as rig:
        token = rig.credential()
        task = await rig.submit(token)
        async with rig.worker(token) as worker:
            offer = await worker.claim()
            too_deep = "[" * 100_000 + "]" * 100_000
            refused = await worker.finish(offer, Failed(code="BAD", details=too_deep))
            await worker.finish(offer, Failed(code="BAD", details='{"why": [1.50]}'))
            other = await rig.submit(token)
            offer = await worker.claim()
            await worker.finish(offer, Failed(code="BAD", details='[2.50, "no"]'))
        read = await rig.http_text("GET", f"/v1/tasks/{task['task_id']}", token=token)
        _, listed = await rig.http("GET", f"/v1/tasks/{other['task_id']}", token=token)
    assert isinstance(refused, Refused)
    assert refused.code is RefusalCode.INVALID_REPORT
    assert refused.message.startswith("details[0][0]")
    assert object_members(object_members(read[1])["failure"])["details"] == '{"why": [1.50]}'
    assert listed["failure"]["details"] == [2.5, "no"]  # any JSON, shown as JSON


@SQLITE
async def test_a_repeat_may_space_its_payload_anew_but_not_change_a_number(
    hub_url: str, autojump_clock: trio.testing.MockClock
) -> None:
    def submission(payload: str) -> bytes:
        return body(payload)[:-1] + b', "task_id": "t1"}'

    async with running_hub(hub_url) as rig:
        token = rig.credential()
        first = await rig.http("POST", SUBMIT, token=token, raw=submission('{"a": [1.10, "x y"]}'))
        again = await rig.http("POST", SUBMIT, token=token, raw=submission('{"a":[1.10,"x y"]}'))
        spaced = await rig.http("POST", SUBMIT, token=token, raw=submission('{"a":[1.10,"x  y"]}'))
        other = await rig.http("POST", SUBMIT, token=token, raw=submission('{"a":[1.1,"x y"]}'))
    assert (first[0], again[0]) == (201, 200)
    assert again[1]["task_id"] == "t1"
    assert (spaced[0], other[0]) == (409, 409)
