"""The plugins under Trio: what each one stores, keeps, logs or refuses.

The jsonl plugin runs its IO in a real worker thread against `tmp_path`; the
result plugin encodes in one.
Every async test runs under `fail_after`.
"""

from __future__ import annotations

import base64
import json
import logging
from pathlib import Path

import msgpack  # type: ignore[import-untyped]  # ships no type information
import pytest
import trio

from blockx.calls import FailureCode, encode_value
from blockx.phases import DuplicateName, UnknownName
from blockx.phases.plugins import (
    KNOWN_PLUGINS,
    MAX_OUTPUTS_BYTES,
    TEST_STORE_TASKS,
    BundleWritePlugin,
    JsonlPlugin,
    LogPlugin,
    MemoryPlugin,
    PluginFailed,
    PluginRegistry,
    PluginRequest,
    ResultPlugin,
    TableUpsertsPlugin,
    plugin_registry,
)
from blockx.phases.plugins import test_outputs as stored_outputs
from blockx.slots import PluginResult, ResultHandler

TIMEOUT_S = 10


def request(
    kind: str, outputs: list[object], *, config: object = None, task_id: str = "t1"
) -> PluginRequest:
    """A request whose outputs are `outputs` msgpack-encoded; `config` is JSON unless a str."""
    config_json = (
        "" if config is None else config if isinstance(config, str) else json.dumps(config)
    )
    return PluginRequest(
        task_id=task_id,
        handler=ResultHandler(type=kind, config_json=config_json),
        outputs=tuple(encode_value(output) for output in outputs),
        task_code_epoch="e1",
    )


def lines_of(path: Path) -> list[object]:
    text = path.read_text(encoding="utf-8")
    assert text.endswith("\n")
    return [json.loads(line) for line in text.splitlines()]


# --- log --------------------------------------------------------------------------------------


async def test_log_plugin_logs_one_line_with_count_size_and_first_values(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="blockx.plugins.log")
    outputs: list[object] = [1, "abc", [1, 2], {"x": 1}]
    log_request = request("log", outputs, task_id="task-log")
    with trio.fail_after(TIMEOUT_S):
        result = await LogPlugin().run(log_request)
    assert result == PluginResult(plugin_type="log", ok=True, records_written=4)
    total_bytes = sum(len(output) for output in log_request.outputs)
    assert total_bytes == 1 + 4 + 3 + 4
    assert [(r.name, r.levelno, r.getMessage()) for r in caplog.records] == [
        (
            "blockx.plugins.log",
            logging.INFO,
            f"task task-log: 4 outputs, {total_bytes} bytes: [1, 'abc', [1, 2], ...]",
        )
    ]


async def test_log_plugin_truncates_a_long_value(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="blockx.plugins.log")
    with trio.fail_after(TIMEOUT_S):
        await LogPlugin().run(request("log", ["x" * 1000], task_id="task-long"))
    (record,) = caplog.records
    shown = "'" + "x" * 196 + "..."
    assert record.getMessage() == f"task task-long: 1 outputs, 1003 bytes: [{shown}]"


async def test_log_plugin_of_no_outputs_logs_an_empty_preview(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="blockx.plugins.log")
    with trio.fail_after(TIMEOUT_S):
        result = await LogPlugin().run(request("log", [], task_id="task-none"))
    assert result.records_written == 0
    assert [r.getMessage() for r in caplog.records] == ["task task-none: 0 outputs, 0 bytes: []"]


async def test_log_plugin_refuses_settings() -> None:
    with trio.fail_after(TIMEOUT_S), pytest.raises(PluginFailed) as caught:
        await LogPlugin().run(request("log", [1], config={"level": "debug"}))
    assert caught.value.message == "log: config_json takes no keys, got 'level'"
    assert caught.value.retryable is False


# --- test (in memory) -------------------------------------------------------------------------


async def test_memory_plugin_keeps_the_decoded_outputs_of_each_task() -> None:
    with trio.fail_after(TIMEOUT_S):
        first = await MemoryPlugin().run(
            request("test", [1, "two", {"three": [3]}, b"\x00"], task_id="mem-a")
        )
        await MemoryPlugin().run(request("test", [], task_id="mem-b"))
    assert first == PluginResult(plugin_type="test", ok=True, records_written=4)
    assert stored_outputs("mem-a") == [1, "two", {"three": [3]}, b"\x00"]
    assert stored_outputs("mem-b") == []
    assert stored_outputs("mem-never-written") is None


async def test_memory_plugin_replaces_what_a_task_wrote_before() -> None:
    with trio.fail_after(TIMEOUT_S):
        await MemoryPlugin().run(request("test", [1], task_id="mem-again"))
        await MemoryPlugin().run(request("test", [2, 3], task_id="mem-again"))
    assert stored_outputs("mem-again") == [2, 3]


async def test_memory_plugin_keeps_only_the_most_recent_tasks() -> None:
    plugin = MemoryPlugin()
    with trio.fail_after(TIMEOUT_S):
        for number in range(TEST_STORE_TASKS + 1):
            await plugin.run(request("test", [number], task_id=f"mem-bound-{number}"))
    assert stored_outputs("mem-bound-0") is None
    assert stored_outputs("mem-bound-1") == [1]
    assert stored_outputs(f"mem-bound-{TEST_STORE_TASKS}") == [TEST_STORE_TASKS]


async def test_memory_plugin_fails_as_configured_and_keeps_nothing() -> None:
    config = {"fail": True, "message": "disk on fire", "retryable": True}
    with trio.fail_after(TIMEOUT_S), pytest.raises(PluginFailed) as caught:
        await MemoryPlugin().run(request("test", [1], config=config, task_id="mem-fail"))
    error = caught.value
    assert (error.code, error.message, error.retryable) == (
        FailureCode.PLUGIN_FAILED,
        "disk on fire",
        True,
    )
    assert stored_outputs("mem-fail") is None


async def test_memory_plugin_failure_defaults_and_custom_code() -> None:
    with trio.fail_after(TIMEOUT_S):
        with pytest.raises(PluginFailed) as default:
            await MemoryPlugin().run(request("test", [1], config={"fail": True}))
        with pytest.raises(PluginFailed) as coded:
            await MemoryPlugin().run(
                request("test", [1], config={"fail": True, "code": "IO_SCOPE_FAILED"})
            )
    assert (default.value.code, default.value.message, default.value.retryable) == (
        FailureCode.PLUGIN_FAILED,
        "test plugin configured to fail",
        False,
    )
    assert coded.value.code is FailureCode.IO_SCOPE_FAILED


async def test_memory_plugin_refuses_a_code_that_is_not_a_failure_code() -> None:
    config = {"fail": True, "code": "SINK_GONE"}
    with trio.fail_after(TIMEOUT_S), pytest.raises(PluginFailed) as caught:
        await MemoryPlugin().run(request("test", [1], config=config, task_id="mem-bad-code"))
    error = caught.value
    assert error.message == (
        "test: config_json.code must be a failure code such as PLUGIN_FAILED, got 'SINK_GONE'"
    )
    assert (error.code, error.retryable) == (FailureCode.PLUGIN_FAILED, False)
    assert stored_outputs("mem-bad-code") is None


async def test_memory_plugin_with_fail_false_stores() -> None:
    with trio.fail_after(TIMEOUT_S):
        result = await MemoryPlugin().run(
            request("test", [7], config={"fail": False}, task_id="mem-no-fail")
        )
    assert result.ok
    assert stored_outputs("mem-no-fail") == [7]


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        pytest.param(
            {"fail": "yes"}, "test: config_json.fail must be true or false, got 'yes'", id="fail"
        ),
        pytest.param(
            {"fail": True, "retryable": 1},
            "test: config_json.retryable must be true or false, got 1",
            id="retryable",
        ),
        pytest.param(
            {"fail": True, "message": ""},
            "test: config_json.message must be a non-empty string, got ''",
            id="message",
        ),
        pytest.param(
            {"fails": True},
            "test: config_json has unknown key 'fails'; allowed keys: fail, message, retryable, "
            "code, delay_ms",
            id="unknown-key",
        ),
        pytest.param(
            {"delay_ms": -1},
            "test: config_json.delay_ms must be an integer from 0 to 86400000, got -1",
            id="negative-delay",
        ),
        pytest.param(
            {"delay_ms": 10**400},  # no float is that large: it once raised OverflowError
            "test: config_json.delay_ms must be an integer from 0 to 86400000, got "
            + repr(10**400)[:77]
            + "...",
            id="huge-delay",
        ),
        pytest.param(
            "[true]", "test: config_json must be a JSON object, got an array", id="not-an-object"
        ),
        pytest.param(
            '{"fail": tru}',
            "test: config_json is not valid JSON: Expecting value: line 1 column 10 (char 9)",
            id="not-json",
        ),
    ],
)
async def test_memory_plugin_refuses_a_bad_config_naming_it(config: object, expected: str) -> None:
    with trio.fail_after(TIMEOUT_S), pytest.raises(PluginFailed) as caught:
        await MemoryPlugin().run(request("test", [1], config=config, task_id="mem-bad-config"))
    assert caught.value.message == expected
    assert caught.value.retryable is False
    assert stored_outputs("mem-bad-config") is None


# --- jsonl ------------------------------------------------------------------------------------


async def test_jsonl_plugin_appends_one_line_per_output(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    outputs: list[object] = [3, "three", [1, {"k": None}], 1.5, True]
    with trio.fail_after(TIMEOUT_S):
        result = await JsonlPlugin().run(
            request("jsonl", outputs, config={"path": str(path)}, task_id="j1")
        )
    assert result == PluginResult(plugin_type="jsonl", ok=True, records_written=5, detail=str(path))
    assert lines_of(path) == [
        {"task_id": "j1", "index": 0, "value": 3},
        {"task_id": "j1", "index": 1, "value": "three"},
        {"task_id": "j1", "index": 2, "value": [1, {"k": None}]},
        {"task_id": "j1", "index": 3, "value": 1.5},
        {"task_id": "j1", "index": 4, "value": True},
    ]
    assert path.read_text(encoding="utf-8").splitlines()[0] == (
        '{"task_id":"j1","index":0,"value":3}'
    )


async def test_jsonl_plugin_appends_across_tasks(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    config = {"path": str(path)}
    with trio.fail_after(TIMEOUT_S):
        await JsonlPlugin().run(request("jsonl", ["a", "b"], config=config, task_id="first"))
        await JsonlPlugin().run(request("jsonl", ["c"], config=config, task_id="second"))
    assert lines_of(path) == [
        {"task_id": "first", "index": 0, "value": "a"},
        {"task_id": "first", "index": 1, "value": "b"},
        {"task_id": "second", "index": 0, "value": "c"},
    ]


async def test_jsonl_plugin_creates_parent_directories(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "out.jsonl"
    with trio.fail_after(TIMEOUT_S):
        await JsonlPlugin().run(request("jsonl", [1], config={"path": str(path)}))
    assert lines_of(path) == [{"task_id": "t1", "index": 0, "value": 1}]


async def test_jsonl_plugin_resolves_a_relative_path_against_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with trio.fail_after(TIMEOUT_S):
        result = await JsonlPlugin().run(request("jsonl", [1], config={"path": "out/rel.jsonl"}))
    assert result.detail == "out/rel.jsonl"
    assert lines_of(tmp_path / "out" / "rel.jsonl") == [{"task_id": "t1", "index": 0, "value": 1}]


async def test_jsonl_plugin_of_no_outputs_writes_no_lines(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    with trio.fail_after(TIMEOUT_S):
        result = await JsonlPlugin().run(request("jsonl", [], config={"path": str(path)}))
    assert result.records_written == 0
    assert path.read_bytes() == b""


async def test_jsonl_plugin_writes_bytes_as_base64_objects(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    with trio.fail_after(TIMEOUT_S):
        await JsonlPlugin().run(
            request("jsonl", [b"\x00\xff", {"blob": b"hi"}], config={"path": str(path)})
        )
    assert lines_of(path) == [
        {"task_id": "t1", "index": 0, "value": {"$bytes": "AP8="}},
        {"task_id": "t1", "index": 1, "value": {"blob": {"$bytes": "aGk="}}},
    ]
    assert base64.b64decode("AP8=") == b"\x00\xff"


NO_JSON_FORM = [
    pytest.param(encode_value(float("nan")), "Out of range float values", id="nan"),
    pytest.param(encode_value(float("inf")), "Out of range float values", id="infinity"),
    pytest.param(msgpack.packb({b"key": 1}), "keys must be str", id="bytes-key"),
    pytest.param(
        msgpack.packb(msgpack.ExtType(5, b"x")), "type ExtType have no JSON form", id="ext-type"
    ),
    pytest.param(b"\xc1", "not a msgpack value", id="not-msgpack"),
]
"""Outputs that have no JSON form, and what the refusal says of each."""


@pytest.mark.parametrize(("bad_output", "reason"), NO_JSON_FORM)
async def test_jsonl_plugin_writes_nothing_when_an_output_has_no_json_form(
    tmp_path: Path, bad_output: bytes, reason: str
) -> None:
    path = tmp_path / "out.jsonl"
    path.write_text('{"before": true}\n', encoding="utf-8")
    jsonl_request = PluginRequest(
        task_id="t1",
        handler=ResultHandler(type="jsonl", config_json=json.dumps({"path": str(path)})),
        outputs=(encode_value(1), encode_value(2), bad_output, encode_value(4)),
        task_code_epoch="e1",
    )
    with trio.fail_after(TIMEOUT_S), pytest.raises(PluginFailed) as caught:
        await JsonlPlugin().run(jsonl_request)
    assert caught.value.message.startswith("jsonl: output 2 ")
    assert reason in caught.value.message
    assert caught.value.retryable is False
    assert path.read_text(encoding="utf-8") == '{"before": true}\n'


async def test_jsonl_plugin_needs_a_path(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT_S):
        with pytest.raises(PluginFailed) as missing:
            await JsonlPlugin().run(request("jsonl", [1], config=""))
        with pytest.raises(PluginFailed) as empty:
            await JsonlPlugin().run(request("jsonl", [1], config={"path": ""}))
        with pytest.raises(PluginFailed) as unknown:
            await JsonlPlugin().run(request("jsonl", [1], config={"file": "x.jsonl"}))
    assert missing.value.message == (
        "jsonl: config_json.path is required: the file to append lines to"
    )
    assert missing.value.retryable is False
    assert empty.value.message == "jsonl: config_json.path must be a non-empty string, got ''"
    assert unknown.value.message == (
        "jsonl: config_json has unknown key 'file'; allowed keys: path"
    )


async def test_jsonl_plugin_reports_an_unwritable_path_as_retryable(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory", encoding="utf-8")
    path = blocker / "out.jsonl"
    with trio.fail_after(TIMEOUT_S), pytest.raises(PluginFailed) as caught:
        await JsonlPlugin().run(request("jsonl", [1], config={"path": str(path)}))
    error = caught.value
    assert error.code is FailureCode.PLUGIN_FAILED
    assert error.retryable is True
    assert error.message.startswith(f"jsonl: cannot append to {str(path)!r}: [Errno ")
    assert isinstance(error.__cause__, OSError)
    assert blocker.read_text(encoding="utf-8") == "not a directory"


# --- result (kept in the retained result) -----------------------------------------------------


async def test_result_plugin_keeps_the_outputs_as_one_json_array_in_call_order() -> None:
    outputs: list[object] = [3, "HI!", [1, {"k": None}], 1.5, True, None, b"\x00\xff", 2**64 - 1]
    with trio.fail_after(TIMEOUT_S):
        result = await ResultPlugin().run(request("result", outputs, task_id="r1"))
    assert result == PluginResult(
        plugin_type="result",
        ok=True,
        records_written=8,
        outputs_json='[3,"HI!",[1,{"k":null}],1.5,true,null,{"$bytes":"AP8="},'
        "18446744073709551615]",
    )
    assert json.loads(result.outputs_json)[-1] == 2**64 - 1  # exact, not a float


async def test_result_plugin_of_no_outputs_keeps_an_empty_array() -> None:
    with trio.fail_after(TIMEOUT_S):
        result = await ResultPlugin().run(request("result", []))
    assert (result.records_written, result.outputs_json) == (0, "[]")


async def test_result_plugin_keeps_outputs_of_exactly_the_default_limit() -> None:
    assert MAX_OUTPUTS_BYTES == 1024 * 1024
    text = "x" * (MAX_OUTPUTS_BYTES - len('["",1]'))
    with trio.fail_after(TIMEOUT_S):
        result = await ResultPlugin().run(request("result", [text, 1]))
    assert len(result.outputs_json.encode("utf-8")) == MAX_OUTPUTS_BYTES
    assert json.loads(result.outputs_json) == [text, 1]


async def test_result_plugin_refuses_outputs_one_byte_over_the_default_limit() -> None:
    text = "x" * (MAX_OUTPUTS_BYTES - len('["",1]') + 1)
    with trio.fail_after(TIMEOUT_S), pytest.raises(PluginFailed) as caught:
        await ResultPlugin().run(request("result", [text, 1]))
    error = caught.value
    assert (error.code, error.retryable) == (FailureCode.OUTPUTS_TOO_LARGE, False)
    assert error.message == (
        "result: the outputs take 1048577 bytes as JSON, over the limit of 1048576 bytes"
    )


async def test_result_plugin_measures_utf8_bytes_against_a_lower_max_bytes() -> None:
    # '["é"]' is 5 characters and 6 bytes; n outputs of 1 are 2n + 1 bytes.
    with trio.fail_after(TIMEOUT_S):
        kept = await ResultPlugin().run(request("result", ["é"], config={"max_bytes": 6}))
        with pytest.raises(PluginFailed) as over:
            await ResultPlugin().run(request("result", ["é"], config={"max_bytes": 5}))
        with pytest.raises(PluginFailed) as many:
            await ResultPlugin().run(request("result", [1] * 5, config={"max_bytes": 9}))
    assert kept.outputs_json == '["é"]'
    assert over.value.code is FailureCode.OUTPUTS_TOO_LARGE
    assert over.value.message == (
        "result: the outputs take 6 bytes as JSON, over the limit of 5 bytes "
        "(config_json.max_bytes)"
    )
    assert many.value.message.startswith("result: the outputs take 11 bytes as JSON, ")


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        pytest.param(
            {"max_bytes": 0},
            "result: config_json.max_bytes must be an integer from 1 to 1048576, got 0",
            id="zero",
        ),
        pytest.param(
            {"max_bytes": 1048577},
            "result: config_json.max_bytes must be an integer from 1 to 1048576, got 1048577",
            id="over-the-worker-limit",
        ),
        pytest.param(
            {"max_bytes": True},
            "result: config_json.max_bytes must be an integer from 1 to 1048576, got True",
            id="boolean",
        ),
        pytest.param(
            {"max_bytes": "10"},
            "result: config_json.max_bytes must be an integer from 1 to 1048576, got '10'",
            id="text",
        ),
        pytest.param(
            {"limit": 10},
            "result: config_json has unknown key 'limit'; allowed keys: max_bytes",
            id="unknown-key",
        ),
    ],
)
async def test_result_plugin_refuses_a_bad_config_naming_it(config: object, expected: str) -> None:
    with trio.fail_after(TIMEOUT_S), pytest.raises(PluginFailed) as caught:
        await ResultPlugin().run(request("result", [1], config=config))
    assert (caught.value.code, caught.value.message) == (FailureCode.PLUGIN_FAILED, expected)
    assert caught.value.retryable is False


@pytest.mark.parametrize(("bad_output", "reason"), NO_JSON_FORM)
async def test_result_plugin_keeps_nothing_when_an_output_has_no_json_form(
    bad_output: bytes, reason: str
) -> None:
    result_request = PluginRequest(
        task_id="t1",
        handler=ResultHandler(type="result"),
        outputs=(encode_value(1), encode_value(2), bad_output),
        task_code_epoch="e1",
    )
    with trio.fail_after(TIMEOUT_S), pytest.raises(PluginFailed) as caught:
        await ResultPlugin().run(result_request)
    assert caught.value.code is FailureCode.PLUGIN_FAILED
    assert caught.value.message.startswith("result: output 2 ")
    assert reason in caught.value.message
    assert caught.value.retryable is False


# --- registry ---------------------------------------------------------------------------------


def test_registry_holds_the_named_plugins() -> None:
    assert KNOWN_PLUGINS == ("log", "test", "jsonl", "result", "table_upserts", "bundle_write")
    registry = plugin_registry(KNOWN_PLUGINS)
    assert registry.names() == KNOWN_PLUGINS
    assert isinstance(registry.get("log"), LogPlugin)
    assert isinstance(registry.get("test"), MemoryPlugin)
    assert isinstance(registry.get("jsonl"), JsonlPlugin)
    assert isinstance(registry.get("result"), ResultPlugin)
    assert isinstance(registry.get("table_upserts"), TableUpsertsPlugin)
    assert isinstance(registry.get("bundle_write"), BundleWritePlugin)
    assert registry.get("warehouse") is None
    assert plugin_registry([]).names() == ()


def test_registry_refuses_an_unknown_plugin_naming_it_and_the_known_ones() -> None:
    with pytest.raises(UnknownName) as caught:
        plugin_registry(["log", "warehouse"])
    assert str(caught.value) == (
        "unknown plugin 'warehouse'; known plugins: log, test, jsonl, result, "
        "table_upserts (tableUpserts), bundle_write (bundleWrite)"
    )


def test_a_plugin_answers_to_the_camel_case_spelling_and_an_unknown_one_names_ours_too() -> None:
    registry = plugin_registry(KNOWN_PLUGINS)
    assert isinstance(registry.get("tableUpserts"), TableUpsertsPlugin)
    with pytest.raises(UnknownName) as caught:
        plugin_registry(["log"]).require("bundleWrite")
    assert str(caught.value) == "unknown plugin 'bundleWrite' (bundle_write); known plugins: log"


def test_registry_of_plugin_instances_refuses_two_with_one_name() -> None:
    with pytest.raises(DuplicateName) as caught:
        PluginRegistry([LogPlugin(), LogPlugin()])
    assert caught.value.name == "log"


INTEGERS_AT_THE_EDGES: list[object] = [
    0,
    1,
    -1,
    2**63 - 1,
    -(2**63),
    2**64 - 1,
    10**18,
    -(10**18) + 7,
    True,
    False,
]


async def test_integers_are_written_as_the_json_encoder_writes_them(tmp_path: Path) -> None:
    """Both plugins spell an integer out themselves, past the encoder: the same text; a
    bool is no integer there (true and false, not 1 and 0)."""
    path = tmp_path / "out.jsonl"
    expected = [json.dumps(value) for value in INTEGERS_AT_THE_EDGES]
    with trio.fail_after(TIMEOUT_S):
        await JsonlPlugin().run(request("jsonl", INTEGERS_AT_THE_EDGES, config={"path": str(path)}))
        kept = await ResultPlugin().run(request("result", INTEGERS_AT_THE_EDGES))
    lines = path.read_text(encoding="utf-8").splitlines()
    assert [line.split('"value":')[1][:-1] for line in lines] == expected
    assert kept.outputs_json == "[" + ",".join(expected) + "]"
