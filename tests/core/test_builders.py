"""The builders: exact calls from good requests, a named refusal for every bad one."""

from __future__ import annotations

import json
from typing import Any

import attrs
import pytest

from blockx.actors._task import build_inline
from blockx.calls import CallSpec, FailureCode, RetryPolicy, decode_args
from blockx.phases import CAMEL_CASE_ALIASES, DuplicateName, Registry, UnknownName
from blockx.phases.builders import (
    KNOWN_BUILDERS,
    Builder,
    BuilderFailed,
    BuilderRegistry,
    BuildRequest,
    CallListBuilder,
    InlineBuilder,
    PayloadBuilder,
    StaticBuilder,
    builder_registry,
)
from blockx.slots import FunctionCall, PrepareTaskActivation, TaskSpec


def request(kind: str, *, config: object = None, payload: object = None) -> BuildRequest:
    """A request; `config`/`payload` given as str or bytes are used verbatim, else as JSON."""
    match config:
        case None:
            config_json = ""
        case str():
            config_json = config
        case _:
            config_json = json.dumps(config)
    match payload:
        case None:
            payload_bytes = b""
        case bytes():
            payload_bytes = payload
        case str():
            payload_bytes = payload.encode()
        case _:
            payload_bytes = json.dumps(payload).encode()
    return BuildRequest(
        task_id="t1",
        function_call=FunctionCall(type=kind, config_json=config_json),
        payload=payload_bytes,
        task_code_epoch="e1",
    )


def plain(calls: list[CallSpec]) -> list[tuple[str, str, list[Any]]]:
    """(call_id, function, positional args) of each call; no call has keyword args."""
    shown: list[tuple[str, str, list[Any]]] = []
    for call in calls:
        positional, keywords = decode_args(call.args)
        assert keywords == {}
        shown.append((call.call_id, call.function, positional))
    return shown


async def refusal(builder: Builder, build_request: BuildRequest) -> BuilderFailed:
    with pytest.raises(BuilderFailed) as caught:
        await builder.build(build_request)
    error = caught.value
    assert error.code is FailureCode.BUILDER_FAILED
    assert error.retryable is False
    assert str(error) == error.message
    return error


# --- call_list ------------------------------------------------------------------------------


async def test_call_list_builds_the_calls_of_a_calls_object_in_order() -> None:
    payload = {
        "calls": [
            {"function": "demo.add", "args": [1, 2]},
            {"function": "demo.echo", "args": [{"k": [1, "x"]}], "id": "mine"},
            {"function": "pkg.mod.fn"},
        ]
    }
    calls = await CallListBuilder().build(request("call_list", payload=payload))
    assert plain(calls) == [
        ("0", "demo.add", [1, 2]),
        ("mine", "demo.echo", [{"k": [1, "x"]}]),
        ("2", "pkg.mod.fn", []),
    ]


async def test_call_list_accepts_a_bare_array_of_calls() -> None:
    payload = [{"function": "demo.echo", "args": ["a"]}, {"function": "demo.echo", "args": [None]}]
    calls = await CallListBuilder().build(request("call_list", payload=payload))
    assert plain(calls) == [("0", "demo.echo", ["a"]), ("1", "demo.echo", [None])]


async def test_call_list_of_no_calls_builds_none() -> None:
    assert await CallListBuilder().build(request("call_list", payload={"calls": []})) == []
    assert await CallListBuilder().build(request("call_list", payload=[])) == []


async def test_call_list_args_are_exactly_what_encode_args_makes() -> None:
    calls = await CallListBuilder().build(
        request("call_list", payload=[{"function": "demo.add", "args": [1, 2]}])
    )
    assert calls == [CallSpec(call_id="0", function="demo.add", args=b"\x92\x01\x02")]


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        pytest.param(
            [{"function": "demo.echo", "id": "a"}, {"function": "demo.echo", "id": "a"}],
            "duplicate call id 'a' at calls[1]",
            id="duplicate-given-id",
        ),
        pytest.param(
            [{"function": "demo.echo"}, {"function": "demo.echo", "id": "0"}],
            "duplicate call id '0' at calls[1]",
            id="given-id-collides-with-an-index",
        ),
        pytest.param(
            [{"function": "demo.echo"}, {"function": "echo"}],
            "calls[1].function must be 'module.function'",
            id="function-without-module",
        ),
        pytest.param(
            [{"function": "demo.not-a-name"}],
            "calls[0].function must be 'module.function'",
            id="function-not-identifiers",
        ),
        pytest.param(
            [{"function": "class.fn"}],
            "calls[0].function must be 'module.function'",
            id="module-is-a-keyword",
        ),
        pytest.param(
            [{"function": 3}], "calls[0].function must be 'module.function'", id="function-number"
        ),
        pytest.param([{"args": [1]}], "calls[0].function is required", id="function-missing"),
        pytest.param(
            [{"function": "demo.echo", "args": 1}],
            "calls[0].args must be a JSON array of arguments, got a number",
            id="args-not-a-list",
        ),
        pytest.param(
            [{"function": "demo.echo", "args": {"x": 1}}],
            "calls[0].args must be a JSON array of arguments, got an object",
            id="args-an-object",
        ),
        pytest.param(
            [{"function": "demo.echo", "id": 7}],
            "calls[0].id must be a non-empty string, got 7",
            id="id-not-a-string",
        ),
        pytest.param(
            [{"function": "demo.echo", "id": ""}],
            "calls[0].id must be a non-empty string",
            id="id-empty",
        ),
        pytest.param(
            [{"function": "demo.echo", "arg": [1]}],
            "calls[0] has unknown key 'arg'; allowed keys: function, args, id",
            id="unknown-key-in-a-call",
        ),
        pytest.param(
            ["demo.echo"], "calls[0] must be an object with 'function'", id="call-not-an-object"
        ),
        pytest.param(
            [{"function": "demo.echo", "args": [2**64]}],
            "calls[0].args cannot be encoded as call arguments",
            id="integer-too-large-for-msgpack",
        ),
        pytest.param({"call": []}, "payload has no 'calls' key", id="object-without-calls"),
        pytest.param(
            {"calls": [], "extra": 1},
            "payload has unknown key 'extra'; allowed keys: calls",
            id="object-with-extra-key",
        ),
        pytest.param(
            {"calls": {"function": "demo.echo"}},
            "payload.calls must be an array, got an object",
            id="calls-not-an-array",
        ),
        pytest.param("3", "payload must be", id="payload-a-number"),
        pytest.param(b"", "payload is empty", id="payload-empty"),
    ],
)
async def test_call_list_refuses_a_bad_payload_naming_the_problem(
    payload: object, expected: str
) -> None:
    error = await refusal(CallListBuilder(), request("call_list", payload=payload))
    assert error.message.startswith("call_list: ")
    assert expected in error.message


@pytest.mark.parametrize(
    ("bad", "expected"),
    [
        ({"function": "demo.echo", "args": 1}, "calls[2].args must be a JSON array"),
        ({"function": "demo.echo", "id": "0"}, "duplicate call id '0' at calls[2]"),
        ({"function": "demo.echo", "args": [2**64]}, "calls[2].args cannot be encoded"),
        ({"function": "demo.echo", "arg": [1]}, "calls[2] has unknown key 'arg'"),
        ({"function": ["demo.echo"]}, "calls[2].function must be 'module.function'"),
        ({"function": "demo.echo", "id": ""}, "calls[2].id must be a non-empty string"),
        ("demo.echo", "calls[2] must be an object"),
    ],
)
async def test_call_list_names_a_bad_call_after_good_ones_alike(bad: object, expected: str) -> None:
    """Calls like those before them are checked on a shorter path; a bad one is still
    refused with the message it gets on its own."""
    good = [{"function": "demo.echo", "args": [1]}, {"function": "demo.echo", "args": [2]}]
    error = await refusal(CallListBuilder(), request("call_list", payload=[*good, bad]))
    assert error.message.startswith(f"call_list: {expected}")


async def test_call_list_of_many_mixed_calls_keeps_each_ones_fields() -> None:
    entries: list[dict[str, object]] = [
        {"function": f"demo.f{index % 3}", "args": [index, "x"]} for index in range(50)
    ]
    entries[7]["id"] = "seventh"
    calls = await CallListBuilder().build(request("call_list", payload=entries))
    assert plain(calls) == [
        ("seventh" if index == 7 else str(index), f"demo.f{index % 3}", [index, "x"])
        for index in range(50)
    ]


async def test_call_list_refuses_a_payload_that_is_not_json_naming_the_position() -> None:
    error = await refusal(CallListBuilder(), request("call_list", payload='{"calls": [}'))
    assert error.message == (
        "call_list: payload is not valid JSON: Expecting value: line 1 column 12 (char 11)"
    )


async def test_a_payload_the_json_parser_refuses_to_hold_is_a_clean_refusal() -> None:
    """A 5,000-digit integer is valid JSON that Python will not convert: it was a
    ValueError escaping the builder (logged with a traceback), now BUILDER_FAILED."""
    huge = "1" * 5000
    error = await refusal(
        PayloadBuilder(), request("payload", config={"function": "demo.echo"}, payload=huge)
    )
    assert error.message.startswith(
        "payload: payload cannot be read: Exceeds the limit (4300 digits) for integer string "
        "conversion"
    )
    error = await refusal(CallListBuilder(), request("call_list", payload=f"[{huge}]"))
    assert error.message.startswith("call_list: payload cannot be read: Exceeds the limit")


async def test_call_list_refuses_a_payload_that_is_not_utf8() -> None:
    error = await refusal(CallListBuilder(), request("call_list", payload=b'["\xff"]'))
    assert error.message.startswith("call_list: payload is not UTF-8 text")


async def test_call_list_refuses_any_config() -> None:
    error = await refusal(
        CallListBuilder(), request("call_list", config={"function": "demo.echo"}, payload=[])
    )
    assert error.message == "call_list: config_json takes no keys, got 'function'"


# --- static ---------------------------------------------------------------------------------


async def test_static_builds_count_identical_calls() -> None:
    config = {"function": "demo.echo", "count": 3, "args": ["hi"]}
    calls = await StaticBuilder().build(request("static", config=config, payload=b"ignored"))
    assert plain(calls) == [
        ("0", "demo.echo", ["hi"]),
        ("1", "demo.echo", ["hi"]),
        ("2", "demo.echo", ["hi"]),
    ]


async def test_static_defaults_to_one_call_without_arguments() -> None:
    calls = await StaticBuilder().build(request("static", config={"function": "demo.echo"}))
    assert plain(calls) == [("0", "demo.echo", [])]


@pytest.mark.parametrize("count", [0, 100_000])
async def test_static_count_bounds_are_allowed(count: int) -> None:
    config = {"function": "demo.echo", "count": count}
    calls = await StaticBuilder().build(request("static", config=config))
    assert len(calls) == count
    assert [call.call_id for call in calls[-1:]] == ([] if count == 0 else [str(count - 1)])


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        pytest.param(
            {},
            "static: config_json.function is required: "
            "'module.function' (dotted Python identifiers)",
            id="function-missing",
        ),
        pytest.param(
            "",
            "static: config_json.function is required: "
            "'module.function' (dotted Python identifiers)",
            id="config-empty",
        ),
        pytest.param(
            {"function": "echo"},
            "static: config_json.function must be 'module.function' (dotted Python identifiers), "
            "got 'echo'",
            id="function-without-module",
        ),
        pytest.param(
            {"function": "demo.echo", "count": -1},
            "static: config_json.count must be an integer from 0 to 100000, got -1",
            id="count-negative",
        ),
        pytest.param(
            {"function": "demo.echo", "count": 100_001},
            "static: config_json.count must be an integer from 0 to 100000, got 100001",
            id="count-too-large",
        ),
        pytest.param(
            {"function": "demo.echo", "count": 2.0},
            "static: config_json.count must be an integer from 0 to 100000, got 2.0",
            id="count-float",
        ),
        pytest.param(
            {"function": "demo.echo", "count": True},
            "static: config_json.count must be an integer from 0 to 100000, got True",
            id="count-boolean",
        ),
        pytest.param(
            {"function": "demo.echo", "args": "x"},
            "static: config_json.args must be a JSON array of arguments, got a string",
            id="args-not-a-list",
        ),
        pytest.param(
            {"function": "demo.echo", "counts": 2},
            "static: config_json has unknown key 'counts'; allowed keys: function, count, args",
            id="unknown-key",
        ),
        pytest.param(
            ["demo.echo"],
            "static: config_json must be a JSON object, got an array",
            id="config-an-array",
        ),
        pytest.param(
            '{"function": "demo.echo",}',
            "static: config_json is not valid JSON: "
            "Expecting property name enclosed in double quotes: line 1 column 26 (char 25)",
            id="config-not-json",
        ),
    ],
)
async def test_static_refuses_a_bad_config_naming_the_problem(
    config: object, expected: str
) -> None:
    error = await refusal(StaticBuilder(), request("static", config=config))
    assert error.message == expected


# --- payload --------------------------------------------------------------------------------


async def test_payload_makes_one_call_per_array_element() -> None:
    config = {"function": "demo.echo"}
    calls = await PayloadBuilder().build(
        request("payload", config=config, payload=[1, "two", [3], {"four": 4}, None])
    )
    assert plain(calls) == [
        ("0", "demo.echo", [1]),
        ("1", "demo.echo", ["two"]),
        ("2", "demo.echo", [[3]]),
        ("3", "demo.echo", [{"four": 4}]),
        ("4", "demo.echo", [None]),
    ]


@pytest.mark.parametrize("value", [{"a": 1}, "text", 7, 1.5, True, None])
async def test_payload_that_is_not_an_array_is_one_call(value: object) -> None:
    calls = await PayloadBuilder().build(
        request("payload", config={"function": "demo.echo"}, payload=json.dumps(value))
    )
    assert plain(calls) == [("0", "demo.echo", [value])]


@pytest.mark.parametrize("payload", [b"", b"  \n", b"[]"])
async def test_payload_empty_or_empty_array_makes_no_calls(payload: bytes) -> None:
    calls = await PayloadBuilder().build(
        request("payload", config={"function": "demo.echo"}, payload=payload)
    )
    assert calls == []


async def test_payload_refuses_a_payload_that_is_not_json_naming_the_position() -> None:
    error = await refusal(
        PayloadBuilder(), request("payload", config={"function": "demo.echo"}, payload="[1, 2")
    )
    assert error.message == (
        "payload: payload is not valid JSON: Expecting ',' delimiter: line 1 column 6 (char 5)"
    )


async def test_payload_names_the_element_that_cannot_be_encoded() -> None:
    error = await refusal(
        PayloadBuilder(),
        request("payload", config={"function": "demo.echo"}, payload=f"[1, {2**70}]"),
    )
    assert error.message.startswith("payload: payload[1] cannot be encoded as call arguments: ")


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        pytest.param(
            "",
            "payload: config_json.function is required: "
            "'module.function' (dotted Python identifiers)",
            id="config-empty",
        ),
        pytest.param(
            {"function": "demo."},
            "payload: config_json.function must be 'module.function' (dotted Python "
            "identifiers), got 'demo.'",
            id="function-empty-name",
        ),
        pytest.param(
            {"function": "demo.echo", "count": 2},
            "payload: config_json has unknown key 'count'; allowed keys: function",
            id="unknown-key",
        ),
        pytest.param(
            "{",
            "payload: config_json is not valid JSON: "
            "Expecting property name enclosed in double quotes: line 1 column 2 (char 1)",
            id="config-not-json",
        ),
    ],
)
async def test_payload_refuses_a_bad_config_naming_the_problem(
    config: object, expected: str
) -> None:
    error = await refusal(PayloadBuilder(), request("payload", config=config, payload=[1]))
    assert error.message == expected


# --- errors and the registry ----------------------------------------------------------------


def test_builder_failed_carries_code_and_retryable() -> None:
    error = BuilderFailed(message="source busy", code=FailureCode.IO_SCOPE_FAILED, retryable=True)
    assert (error.code, error.message, error.retryable) == (
        FailureCode.IO_SCOPE_FAILED,
        "source busy",
        True,
    )
    assert str(error) == "source busy"


def test_registry_holds_the_named_builders_in_order() -> None:
    registry = builder_registry(["payload", "call_list", "payload"])
    assert registry.names() == ("payload", "call_list")
    assert isinstance(registry.get("payload"), PayloadBuilder)
    assert isinstance(registry.get("call_list"), CallListBuilder)
    assert registry.get("static") is None
    assert "static" not in registry
    assert len(registry) == 2


def test_every_known_builder_can_be_registered_under_its_own_name() -> None:
    assert KNOWN_BUILDERS == ("call_list", "dbscan", "bundle_scan", "static", "payload")
    registry = builder_registry(KNOWN_BUILDERS)
    assert registry.names() == KNOWN_BUILDERS
    for name in KNOWN_BUILDERS:
        builder = registry.get(name)
        assert builder is not None
        assert builder.name == name


def test_registry_refuses_an_unknown_builder_naming_it_and_the_known_ones() -> None:
    with pytest.raises(UnknownName) as caught:
        builder_registry(["call_list", "tablescan"])
    assert caught.value.name == "tablescan"
    assert caught.value.known == KNOWN_BUILDERS
    assert str(caught.value) == (
        "unknown builder 'tablescan'; known builders: call_list (callList), dbscan, "
        "bundle_scan (bundleScan), static, payload"
    )


def test_an_unknown_name_is_quoted_cut_short() -> None:
    # A task names the type: its refusal is kept in the task's result.
    error = UnknownName(kind="builder", name="x" * 1_000_000, known=("call_list",))
    assert str(error) == f"unknown builder '{'x' * 76}...; known builders: call_list (callList)"


# --- camelCase aliases (the names the Go worker uses) ----------------------------------------


def test_the_camel_case_aliases_map_to_our_names() -> None:
    assert dict(CAMEL_CASE_ALIASES) == {
        "callList": "call_list",
        "bundleScan": "bundle_scan",
        "bundleWrite": "bundle_write",
        "tableUpserts": "table_upserts",
    }


def test_a_builder_answers_to_the_camel_case_alias_of_its_name() -> None:
    registry = builder_registry(["callList", "static", "call_list"])
    assert registry.names() == ("call_list", "static")
    builder = registry.get("callList")
    assert isinstance(builder, CallListBuilder)
    assert registry.get("call_list") is builder
    assert registry.require("callList") is builder
    assert "callList" in registry
    assert "staticList" not in registry


def test_an_unknown_name_is_refused_listing_the_known_ones_in_both_spellings() -> None:
    with pytest.raises(UnknownName) as caught:
        builder_registry(["call_list", "bundleWrite"])
    assert caught.value.known == KNOWN_BUILDERS
    assert str(caught.value) == (
        "unknown builder 'bundleWrite' (bundle_write); known builders: call_list (callList), "
        "dbscan, bundle_scan (bundleScan), static, payload"
    )
    registry = builder_registry(["callList"])
    with pytest.raises(UnknownName) as caught:
        registry.require("foo")
    assert str(caught.value) == "unknown builder 'foo'; known builders: call_list (callList)"


@attrs.frozen
class Named:
    """An implementation that has only a name, standing in for a data-phase builder or writer."""

    name: str


@pytest.mark.parametrize(
    ("alias", "ours"),
    [
        ("dbscan", "dbscan"),
        ("bundleScan", "bundle_scan"),
        ("bundleWrite", "bundle_write"),
        ("tableUpserts", "table_upserts"),
    ],
)
def test_a_data_phase_name_answers_to_both_spellings_once_registered(alias: str, ours: str) -> None:
    implementation = Named(name=ours)
    registry = Registry([implementation])
    assert registry.names() == (ours,)
    assert registry.require(alias) is implementation
    assert registry.require(ours) is implementation
    with pytest.raises(DuplicateName):
        Registry([implementation, Named(name=alias)])


def test_registry_of_builder_instances_refuses_two_with_one_name() -> None:
    assert BuilderRegistry([StaticBuilder()]).names() == ("static",)
    with pytest.raises(DuplicateName) as caught:
        BuilderRegistry([StaticBuilder(), StaticBuilder()])
    assert str(caught.value) == "two builders are named 'static'; each name may be registered once"


@pytest.mark.parametrize(
    ("kind", "config", "payload"),
    [
        ("call_list", None, {"calls": [{"function": "m.f", "args": [1]}, {"function": "m.g"}]}),
        ("static", {"function": "m.f", "args": ["x"], "count": 3}, None),
        ("payload", {"function": "m.f"}, [1, "two", {"three": 3}]),
    ],
)
async def test_each_builtin_builder_builds_the_same_calls_inline(
    kind: str, config: object, payload: object
) -> None:
    builder = builder_registry([kind]).require(kind)
    built = request(kind, config=config, payload=payload)
    inline: InlineBuilder = builder  # type: ignore[assignment]  # every built-in one is
    assert inline.build_now(built) == await builder.build(built)


def activation(kind: str, payload: bytes) -> PrepareTaskActivation:
    spec = TaskSpec(task_id="t1", function_call=FunctionCall(type=kind), payload=payload)
    return PrepareTaskActivation(
        task_id="t1",
        slot_id="slot-0",
        spec=spec,
        retry_policy=RetryPolicy(max_attempts=1, base_backoff_ms=0, jitter_percent=0),
        deadline_ms=0,
        stimulus_id="s",
    )


def test_an_inline_build_reports_its_calls_as_the_builder_phase_outcome() -> None:
    command = activation("call_list", b'{"calls": [{"function": "m.f"}, {"function": "m.g"}]}')
    outcome, calls = build_inline(CallListBuilder().build_now, command, "e1")
    assert (outcome.ok, outcome.call_count) == (True, 2)
    assert [call.function for call in calls] == ["m.f", "m.g"]


def test_an_inline_build_refused_fails_its_phase_with_the_builders_code() -> None:
    outcome, calls = build_inline(CallListBuilder().build_now, activation("call_list", b"{"), "e1")
    assert (outcome.ok, outcome.failure_code, calls) == (False, FailureCode.BUILDER_FAILED, ())
    assert "payload" in outcome.message


def test_an_inline_builder_that_raises_fails_its_phase_and_logs_the_task(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def broken(request: BuildRequest) -> list[CallSpec]:
        raise RuntimeError(f"cannot build {request.task_id}")

    outcome, calls = build_inline(broken, activation("call_list", b"[]"), "e1")
    assert (outcome.ok, outcome.message, calls) == (
        False,
        "builder raised RuntimeError('cannot build t1')",
        (),
    )
    [record] = caplog.records
    assert record.getMessage() == "task t1: BUILDER phase raised"
    fields = vars(record)
    task_fields = (fields["task_id"], fields["slot_id"], fields["task_code_epoch"])
    assert task_fields == ("t1", "slot-0", "e1")
    assert record.exc_info is not None
