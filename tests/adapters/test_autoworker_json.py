"""Exact JSON from producer to hub to handler to reader, on the in-process hub.

A producer submits a JSON text with numbers spelled every way JSON allows
(`1.10`, `-0`, `1E5`, `1e-7`, 64-bit integers); the handler gets that very
text, and its numbers as `Decimal`s when it asks; what it returns comes back to
the reader byte for byte (a `RawJson`) or equal in every digit (Decimals).
"""

from __future__ import annotations

import decimal
import json
import re
from typing import Any, Final

import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from blockx.autoworker import (
    HubRequestFailed,
    RawJson,
    Worker,
    WorkerExecution,
    WorkerHandler,
    WorkerOptions,
)
from blockx.hubwire import MAX_INT, MIN_INT, InvalidJson, object_members, task_path
from blockx.process.clock import EpochClock
from tests.adapters.autoworker_rig import SQLITE, rig_client
from tests.adapters.hub_harness import CAPABILITY, EPOCH_MS, QUEUE, running_hub

_STRING: Final = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')
_NUMBER: Final = re.compile(r"-?[0-9]+(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?")


def numbers_in(text: str) -> list[str]:
    """The number tokens of a JSON text, in order (strings left out)."""
    return _NUMBER.findall(_STRING.sub('""', text))


def value_of(token: str) -> decimal.DecimalTuple:
    """What a number token says, digit for digit: its sign, digits and exponent (`1.10`
    and `1.1` differ, `1E5` and `1E+5` do not). An integer is read as a handler reads
    it, as an `int` (`-0` is 0)."""
    exact = int(token) if re.fullmatch(r"-?[0-9]+", token) else token
    return decimal.Decimal(exact).as_tuple()


DIGITS: Final = st.text("0123456789", min_size=1, max_size=8)
NUMBERS: Final = st.one_of(
    st.sampled_from(["1.10", "-0", "1E5", "1e-7", "-0.0", "0E+0", "2.50e-3"]),
    st.integers(MIN_INT, MAX_INT).map(str),
    st.builds(
        lambda sign, whole, fraction, exponent: f"{sign}{whole}{fraction}{exponent}",
        st.sampled_from(["", "-"]),
        st.integers(0, 10**6).map(str),
        st.one_of(st.just(""), DIGITS.map(lambda digits: "." + digits)),
        st.one_of(
            st.just(""),
            st.builds(
                lambda e, sign, power: f"{e}{sign}{power}",
                st.sampled_from("eE"),
                st.sampled_from(["", "+", "-"]),
                st.integers(0, 300),
            ),
        ),
    ),
)
STRINGS: Final = st.one_of(
    st.builds(
        lambda text, ascii_only: json.dumps(text, ensure_ascii=ascii_only), st.text(), st.booleans()
    ),
    st.sampled_from(['"\\/"', '"\\u00e9\\n"', '"\\ud83d\\ude00"', '"caf\\u00E9"']),
)
SEPARATORS: Final = st.sampled_from([",", ", ", " ,\n\t"])


def arrays(items: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return st.builds(
        lambda values, separator: "[" + separator.join(values) + "]",
        st.lists(items, max_size=4),
        SEPARATORS,
    )


def objects(items: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return st.builds(
        lambda members, separator: "{" + separator.join(f"{k}: {v}" for k, v in members) + "}",
        st.lists(st.tuples(STRINGS, items), max_size=4, unique_by=lambda kv: json.loads(kv[0])),
        SEPARATORS,
    )


DOCUMENTS: Final = st.recursive(
    NUMBERS | STRINGS | st.sampled_from(["true", "false", "null"]),
    lambda inner: arrays(inner) | objects(inner),
    max_leaves=30,
)


async def echo_both(execution: WorkerExecution) -> Any:
    """The payload twice: its text as it came, and its value as Decimals write it."""
    return {"text": RawJson(execution.payload_text), "value": execution.payload}


@SQLITE
@settings(max_examples=30, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(document=DOCUMENTS)
async def test_numbers_reach_the_handler_and_the_reader_exactly(
    hub_url: str, autojump_clock: trio.testing.MockClock, document: str
) -> None:
    handler = WorkerHandler(capability=CAPABILITY, handle=echo_both, decimals=True)
    options = WorkerOptions(queue_id=QUEUE, handlers=[handler])
    async with running_hub(hub_url) as rig:
        client = rig_client(rig, rig.credential())
        task = await client.submit(QUEUE, CAPABILITY, RawJson(document))
        auto = Worker(client, options, clock=EpochClock(epoch_ms=EPOCH_MS))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(auto.run)
            read = await client.request_text("GET", task_path(task["task_id"]) + "?wait_ms=30000")
            as_decimals = await client.task(task["task_id"], decimals=True)
            nursery.cancel_scope.cancel()
    shown = object_members(read)
    assert json.loads(shown["state"]) == "SUCCEEDED"
    assert shown["payload"] == document
    result = object_members(shown["result"])
    assert result["text"] == document
    assert [value_of(n) for n in numbers_in(result["value"])] == [
        value_of(n) for n in numbers_in(document)
    ]
    exact = json.loads(document, parse_float=decimal.Decimal)
    assert json.loads(result["value"], parse_float=decimal.Decimal) == exact
    assert as_decimals["payload"] == exact


@SQLITE
async def test_a_producer_is_told_which_value_of_its_payload_is_refused(
    hub_url: str, autojump_clock: trio.testing.MockClock
) -> None:
    async with running_hub(hub_url) as rig:
        client = rig_client(rig, rig.credential())
        with pytest.raises(InvalidJson) as unwritable:  # refused before it is sent
            await client.submit(QUEUE, CAPABILITY, {"items": [{"price": float("nan")}]})
        with pytest.raises(HubRequestFailed) as refused:
            await client.submit(QUEUE, CAPABILITY, RawJson('{"items": [{"price": NaN}]}'))
        listed = await client.request("GET", f"/v1/queues/{QUEUE}/tasks")
    assert unwritable.value.field == "payload.items[0].price"
    assert (refused.value.status, refused.value.body["field"]) == (400, "payload.items[0].price")
    assert listed == {"tasks": []}
