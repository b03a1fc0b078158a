"""The command line and the task-spec helpers, without a worker.

Covers building a `TaskSpec` from arguments and from a JSON task file (every
error names its key), worker addresses, the progress line, `serve` (the
configuration it prints and the overrides it passes to `blockx.app.run`), flag
errors (exit 1, one line naming the flag), usage errors (exit 2) and an
unreachable worker. No test here opens a server.
"""

from __future__ import annotations

import io
import json
import socket
from pathlib import Path
from typing import Any

import pytest
from grpclib.const import Status

from blockx import cli, settings
from blockx._proto.blockx.worker import v1 as pb
from blockx.client import (
    InvalidOutputs,
    InvalidTaskSpec,
    InvalidWorkerAddress,
    TaskOutcome,
    WorkerCallError,
    WorkerUnreachable,
    parse_worker_address,
    readable,
    task_lines,
    task_outputs,
    task_spec,
    task_spec_from_json,
    task_specs_from_lines,
)
from blockx.config import WorkerConfig
from blockx.phases import spelled
from blockx.phases.builders import builder_registry
from blockx.phases.plugins import plugin_registry
from blockx.profiles import BLOCK, PROFILES
from blockx.settings import FlagError

CONFIG_ENV = (
    "WORKER_CONFIG",
    "WORKER_LISTEN",
    "WORKER_ADDR",
    "WORKER_REGISTRY_PREFIX",
    "TASK_SLOTS",
    "EXECUTOR_COUNT",
    "FUNCTIONS_DIR",
    "FUNCTIONS_REDIS_URL",
    "STREAM_BUILD_ENABLED",
)


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in CONFIG_ENV:
        monkeypatch.delenv(name, raising=False)


def free_port() -> int:
    """A port nobody listens on (bound, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def last_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    return err.rstrip("\n")


# --- task_spec -----------------------------------------------------------------------------


def test_task_spec_with_every_argument() -> None:
    spec = task_spec(
        "t1",
        builder="call_list",
        config={"calls": [{"fn": "demo.add", "args": [1, 2]}]},
        payload=b"\x00raw",
        plugin="jsonl",
        plugin_config={"path": "/tmp/out.jsonl"},
        timeout_ms=30_000,
        best_effort=True,
        retry=pb.CallRetryPolicy(max_attempts=4, base_backoff_ms=20, jitter_percent=5),
        labels={"team": "core"},
    )
    assert spec == pb.TaskSpec(
        task_id="t1",
        function_call=pb.FunctionCallConfig(
            type="call_list", config_json='{"calls":[{"fn":"demo.add","args":[1,2]}]}'
        ),
        payload=b"\x00raw",
        result_handler=pb.ResultHandler(type="jsonl", config_json='{"path":"/tmp/out.jsonl"}'),
        task_timeout_ms=30_000,
        call_failure_policy=pb.CallFailurePolicy.BEST_EFFORT,
        call_retry_policy=pb.CallRetryPolicy(max_attempts=4, base_backoff_ms=20, jitter_percent=5),
        labels={"team": "core"},
    )


def test_task_spec_defaults_leave_the_worker_in_charge() -> None:
    spec = task_spec("t1", builder="static")
    assert spec == pb.TaskSpec(
        task_id="t1",
        function_call=pb.FunctionCallConfig(type="static", config_json=""),
        payload=b"",
        result_handler=None,
        task_timeout_ms=0,
        call_failure_policy=pb.CallFailurePolicy.FAIL_FAST,
        call_retry_policy=None,
        labels={},
    )


def test_task_spec_plugin_without_config_sends_no_config() -> None:
    spec = task_spec("t1", builder="static", plugin="log")
    assert spec.result_handler == pb.ResultHandler(type="log", config_json="")


TASK_SPEC_ERRORS: list[tuple[str, dict[str, Any], str]] = [
    ("task_id", {"task_id": ""}, "must be a non-empty string"),
    ("builder", {"builder": ""}, "must be a non-empty string"),
    ("builder", {"builder": 3}, "must be a non-empty string"),
    ("config", {"config": ["a"]}, "must be a JSON object"),
    ("config", {"config": {"x": {1, 2}}}, "must be JSON"),
    ("config", {"config": {"x": float("nan")}}, "must be JSON"),
    ("payload", {"payload": "text"}, "must be bytes"),
    ("plugin", {"plugin": ""}, "must be a non-empty string"),
    ("plugin_config", {"plugin_config": {"a": 1}}, "needs a plugin"),
    ("plugin_config", {"plugin": "log", "plugin_config": "a=1"}, "must be a JSON object"),
    ("timeout_ms", {"timeout_ms": -1}, "must be an integer from 0 to"),
    ("timeout_ms", {"timeout_ms": 2**63}, "must be an integer from 0 to"),
    ("timeout_ms", {"timeout_ms": True}, "must be an integer from 0 to"),
    ("best_effort", {"best_effort": "yes"}, "must be a boolean"),
    ("retry", {"retry": {"max_attempts": 3}}, "must be a CallRetryPolicy"),
    ("retry.max_attempts", {"retry": pb.CallRetryPolicy(max_attempts=-1)}, "from 0 to"),
    ("retry.jitter_percent", {"retry": pb.CallRetryPolicy(jitter_percent=2**32)}, "from 0 to"),
    ("labels", {"labels": ["a"]}, "must be an object of strings"),
    ("labels.team", {"labels": {"team": 7}}, "must be a string"),
]


@pytest.mark.parametrize(("key", "change", "allowed"), TASK_SPEC_ERRORS)
def test_task_spec_errors_name_the_argument(key: str, change: dict[str, Any], allowed: str) -> None:
    arguments: dict[str, Any] = {"task_id": "t1", "builder": "static", **change}
    task_id = arguments.pop("task_id")
    with pytest.raises(InvalidTaskSpec) as excinfo:
        task_spec(task_id, **arguments)
    assert excinfo.value.field == key
    assert allowed in excinfo.value.allowed
    assert str(excinfo.value).startswith(f"task {key} = ")


# --- task_spec_from_json -------------------------------------------------------------------


def test_task_file_with_every_key() -> None:
    document = {
        "task_id": "t1",
        "builder": "call_list",
        "config": {"calls": []},
        "payload": {"rows": [1, 2]},
        "plugin": "jsonl",
        "plugin_config": {"path": "out.jsonl"},
        "timeout_ms": 5_000,
        "failure_policy": "best_effort",
        "retry": {"max_attempts": 5, "base_backoff_ms": 100, "jitter_percent": 3},
        "labels": {"run": "nightly"},
    }
    assert task_spec_from_json(document) == pb.TaskSpec(
        task_id="t1",
        function_call=pb.FunctionCallConfig(type="call_list", config_json='{"calls":[]}'),
        payload=b'{"rows":[1,2]}',
        result_handler=pb.ResultHandler(type="jsonl", config_json='{"path":"out.jsonl"}'),
        task_timeout_ms=5_000,
        call_failure_policy=pb.CallFailurePolicy.BEST_EFFORT,
        call_retry_policy=pb.CallRetryPolicy(max_attempts=5, base_backoff_ms=100, jitter_percent=3),
        labels={"run": "nightly"},
    )


@pytest.mark.parametrize(
    ("plugin_key", "config_key"),
    [("plugin", "plugin_config"), ("writer", "writer_config"), ("plugin", "writer_config")],
)
def test_task_file_reads_the_plugin_under_either_spelling(plugin_key: str, config_key: str) -> None:
    document = {
        "task_id": "t1",
        "builder": "static",
        plugin_key: "jsonl",
        config_key: {"path": "out.jsonl"},
    }
    assert task_spec_from_json(document) == task_spec(
        "t1", builder="static", plugin="jsonl", plugin_config={"path": "out.jsonl"}
    )


@pytest.mark.parametrize(
    ("document", "key", "allowed"),
    [
        (
            {"task_id": "t1", "builder": "static", "plugin": "log", "writer": "jsonl"},
            "writer",
            "gives 'plugin' again",
        ),
        (
            {
                "task_id": "t1",
                "builder": "static",
                "plugin": "log",
                "writer_config": {},
                "plugin_config": {},
            },
            "plugin_config",
            "gives 'plugin_config' again",
        ),
    ],
)
def test_task_file_giving_a_key_under_both_spellings_is_refused(
    document: dict[str, object], key: str, allowed: str
) -> None:
    with pytest.raises(InvalidTaskSpec) as excinfo:
        task_spec_from_json(document)
    assert excinfo.value.field == key
    assert excinfo.value.allowed == allowed
    assert str(excinfo.value).startswith(f"task {key} = ")


def test_task_file_with_only_the_required_keys() -> None:
    assert task_spec_from_json({"task_id": "t1", "builder": "static"}) == task_spec(
        "t1", builder="static"
    )


def test_task_file_payload_text_is_sent_as_utf8() -> None:
    spec = task_spec_from_json({"task_id": "t1", "builder": "payload", "payload_text": "h\u00e9"})
    assert spec.payload == "h\u00e9".encode()


def test_task_file_payload_string_is_sent_as_its_json_text() -> None:
    spec = task_spec_from_json({"task_id": "t1", "builder": "payload", "payload": "hi"})
    assert spec.payload == b'"hi"'


def test_task_file_nulls_count_as_absent() -> None:
    document = {"task_id": "t1", "builder": "static", "config": None, "plugin": None, "retry": None}
    assert task_spec_from_json(document) == task_spec("t1", builder="static")
    old_spelling = {"task_id": "t1", "builder": "static", "writer": None, "writer_config": None}
    assert task_spec_from_json(old_spelling) == task_spec("t1", builder="static")


def test_task_file_retry_fields_left_out_are_zero() -> None:
    spec = task_spec_from_json({"task_id": "t1", "builder": "static", "retry": {"max_attempts": 2}})
    assert spec.call_retry_policy == pb.CallRetryPolicy(max_attempts=2)


def test_task_id_argument_wins_over_the_files() -> None:
    spec = task_spec_from_json({"task_id": "t1", "builder": "static"}, task_id="t2")
    assert spec.task_id == "t2"
    assert task_spec_from_json({"builder": "static"}, task_id="t3").task_id == "t3"


TASK_FILE_ERRORS: list[tuple[str, object, str]] = [
    ("file", ["not", "an", "object"], "must be a JSON object"),
    ("color", {"task_id": "t1", "builder": "static", "color": "red"}, "is not a task key"),
    ("task_id", {"builder": "static"}, "is required"),
    ("task_id", {"task_id": 7, "builder": "static"}, "must be a non-empty string"),
    ("builder", {"task_id": "t1"}, "is required"),
    ("builder", {"task_id": "t1", "builder": ["static"]}, "must be a non-empty string"),
    ("config", {"task_id": "t1", "builder": "static", "config": "{}"}, "must be a JSON object"),
    (
        "payload_text",
        {"task_id": "t1", "builder": "static", "payload": 1, "payload_text": "1"},
        "not both",
    ),
    ("payload_text", {"task_id": "t1", "builder": "static", "payload_text": 1}, "a string"),
    ("payload", {"task_id": "t1", "builder": "static", "payload": float("inf")}, "must be JSON"),
    ("plugin", {"task_id": "t1", "builder": "static", "plugin": 1}, "non-empty string"),
    (
        "plugin_config",
        {"task_id": "t1", "builder": "static", "plugin": "log", "plugin_config": [1]},
        "must be a JSON object",
    ),
    ("timeout_ms", {"task_id": "t1", "builder": "static", "timeout_ms": "5"}, "an integer"),
    ("timeout_ms", {"task_id": "t1", "builder": "static", "timeout_ms": 1.5}, "an integer"),
    ("failure_policy", {"task_id": "t1", "builder": "static", "failure_policy": "x"}, "one of"),
    ("failure_policy", {"task_id": "t1", "builder": "static", "failure_policy": [1]}, "one of"),
    ("retry", {"task_id": "t1", "builder": "static", "retry": 3}, "must be a JSON object"),
    (
        "retry.tries",
        {"task_id": "t1", "builder": "static", "retry": {"max_attempts": 3, "tries": 1}},
        "is not a retry key",
    ),
    (
        "retry.max_attempts",
        {"task_id": "t1", "builder": "static", "retry": {"base_backoff_ms": 3}},
        "is required",
    ),
    (
        "retry.jitter_percent",
        {"task_id": "t1", "builder": "static", "retry": {"max_attempts": 3, "jitter_percent": "5"}},
        "an integer",
    ),
    ("labels", {"task_id": "t1", "builder": "static", "labels": "a=b"}, "object of strings"),
    ("labels.n", {"task_id": "t1", "builder": "static", "labels": {"n": 1}}, "must be a string"),
]


@pytest.mark.parametrize(("key", "document", "allowed"), TASK_FILE_ERRORS)
def test_task_file_errors_name_the_key(key: str, document: Any, allowed: str) -> None:
    with pytest.raises(InvalidTaskSpec) as excinfo:
        task_spec_from_json(document)
    assert excinfo.value.field == key
    assert allowed in excinfo.value.allowed
    assert key in str(excinfo.value)


def test_unknown_task_key_error_lists_the_keys() -> None:
    with pytest.raises(InvalidTaskSpec) as excinfo:
        task_spec_from_json({"task_id": "t1", "builder": "x", "timeout": 5})
    assert str(excinfo.value) == (
        "task timeout = 5: is not a task key; the keys are task_id, builder, config, payload, "
        "payload_text, plugin, plugin_config, timeout_ms, failure_policy, retry, labels"
    )


# --- errors and addresses ------------------------------------------------------------------


def test_call_error_names_the_rpc_and_the_status() -> None:
    error = WorkerCallError(rpc="SubmitTask", status=Status.UNAVAILABLE, message="draining")
    assert str(error) == "SubmitTask failed: UNAVAILABLE: draining"
    assert str(WorkerCallError(rpc="WatchTasks", status=Status.INTERNAL, message="")) == (
        "WatchTasks failed: INTERNAL"
    )


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        ("127.0.0.1:8081", ("127.0.0.1", 8081)),
        ("worker-3.internal:50051", ("worker-3.internal", 50051)),
        ("[::1]:8081", ("::1", 8081)),
    ],
)
def test_worker_addresses(address: str, expected: tuple[str, int]) -> None:
    assert parse_worker_address(address) == expected


@pytest.mark.parametrize(
    "address", ["localhost", ":8081", "host:", "host:http", "host:0", "h:70000"]
)
def test_bad_worker_addresses(address: str) -> None:
    with pytest.raises(InvalidWorkerAddress) as excinfo:
        parse_worker_address(address)
    assert excinfo.value.value == address


# --- progress ------------------------------------------------------------------------------


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def update(phase: pb.TaskPhase, state: pb.TaskState = pb.TaskState.RUNNING) -> pb.TaskUpdate:
    is_terminal = phase == pb.TaskPhase.TERMINAL
    return pb.TaskUpdate(task_id="t1", state=state, phase=phase, is_terminal=is_terminal)


def test_progress_on_a_terminal_redraws_one_line() -> None:
    now_s = [100.0]
    stream = Terminal()
    with cli.Progress(stream, "t1", clock=lambda: now_s[0]) as progress:
        progress.redraw()  # nothing to show before the first update
        progress.update(update(pb.TaskPhase.PREPARING))
        now_s[0] = 101.5
        progress.redraw()
        now_s[0] = 102.25
        progress.update(update(pb.TaskPhase.CALLS))
        now_s[0] = 103.0
        progress.update(update(pb.TaskPhase.TERMINAL, pb.TaskState.SUCCEEDED))
    assert stream.getvalue() == (
        "\rtask t1: PREPARING 0.0s"
        "\rtask t1: PREPARING 1.5s"
        "\rtask t1: CALLS 2.2s    "
        "\rtask t1: SUCCEEDED 3.0s"
        "\n"
    )


def test_progress_elsewhere_writes_a_line_per_update() -> None:
    now_s = [0.0]
    stream = io.StringIO()
    with cli.Progress(stream, "t1", clock=lambda: now_s[0]) as progress:
        progress.update(update(pb.TaskPhase.PREPARING))
        now_s[0] = 1.0
        progress.redraw()
        progress.update(update(pb.TaskPhase.TERMINAL, pb.TaskState.FAILED))
    assert stream.getvalue() == "task t1: PREPARING 0.0s\ntask t1: FAILED 1.0s\n"


# --- outputs kept in a result --------------------------------------------------------------


def test_task_outputs_are_the_kept_json_array_or_none() -> None:
    assert task_outputs(pb.TaskResult(task_id="t1")) is None
    assert task_outputs(pb.TaskResult(task_id="t1", outputs_json="[]")) == []
    kept = pb.TaskResult(task_id="t1", outputs_json='[3,"HI!",[1,{"k":null}]]')
    assert task_outputs(kept) == [3, "HI!", [1, {"k": None}]]


@pytest.mark.parametrize(
    ("outputs_json", "reason"),
    [
        pytest.param("[3,", "is not JSON (Expecting value: line 1 column 4 (char 3))", id="cut"),
        pytest.param('{"a": 1}', "is an object, not an array", id="object"),
    ],
)
def test_task_outputs_that_are_not_a_json_array_are_refused_naming_the_task(
    outputs_json: str, reason: str
) -> None:
    with pytest.raises(InvalidOutputs) as caught:
        task_outputs(pb.TaskResult(task_id="t1", outputs_json=outputs_json))
    assert str(caught.value) == f"the outputs_json of task t1 {reason}"


def test_printed_results_show_kept_outputs_as_json_values_in_place() -> None:
    result = pb.TaskResult(task_id="t1", outputs_json="[3]", task_code_epoch="e1")
    assert readable(result) == {"taskId": "t1", "taskCodeEpoch": "e1", "outputs": [3]}
    response = pb.GetTaskResultResponse(task_id="t1", result=result)
    assert readable(response)["result"]["outputs"] == [3]
    update = pb.TaskUpdate(task_id="t1", is_terminal=True, result=result)
    assert readable(update)["result"]["outputs"] == [3]
    assert readable(pb.TaskResult(task_id="t1")) == {"taskId": "t1"}


def test_printed_outputs_that_are_not_a_json_array_stay_as_sent() -> None:
    result = pb.TaskResult(task_id="t1", outputs_json="[3,")
    assert readable(result) == {"taskId": "t1", "outputsJson": "[3,"}


# --- serve ---------------------------------------------------------------------------------


@pytest.mark.usefixtures("clean_env")
def test_serve_print_config_applies_the_flags(capsys: pytest.CaptureFixture[str]) -> None:
    status = cli.main(["serve", "--print-config", "--slots", "3", "--listen", "127.0.0.1:0"])
    printed = json.loads(capsys.readouterr().out)
    assert status == 0
    assert printed["worker"]["taskSlots"] == 3
    assert printed["listenAddr"] == "127.0.0.1:0"
    assert printed["executorCount"] == 8
    assert printed["workerRegistryPrefix"] == "/blockx/workers/"


@pytest.mark.usefixtures("clean_env")
def test_serve_print_config_of_the_bundle_profile(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["serve", "--profile", "bundle", "--print-config", "--executors", "2"]
    assert cli.main(argv) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["workerRegistryPrefix"] == "/blockx/bundle-workers/"
    assert printed["streamBuild"]["enabled"] is True
    assert printed["executorCount"] == 2


@pytest.mark.usefixtures("clean_env")
def test_serve_with_a_bad_flag_value_exits_1_naming_the_setting(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["serve", "--print-config", "--slots", "0"]) == 1
    assert last_error_line(capsys) == (
        "blockx: error: worker.taskSlots = 0 (from --slots): must be > 0"
    )


@pytest.mark.usefixtures("clean_env")
@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--listen", "8081"], "listenAddr = '8081' (from --listen): must be"),
        (["--executors", "-1"], "executorCount = -1 (from --executors): must be > 0"),
        (["--functions", ""], "functionCode.dir = '' (from --functions): must name a directory"),
    ],
)
def test_serve_flag_errors_name_the_flag(
    flags: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["serve", "--print-config", *flags]) == 1
    assert last_error_line(capsys).startswith(f"blockx: error: {expected}")


def test_serve_help_shows_each_flags_setting_and_default(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        cli.main(["serve", "--help"])
    shown = " ".join(capsys.readouterr().out.split())
    for text in (
        "listenAddr, env WORKER_LISTEN (default :8081)",
        "worker.taskSlots, env TASK_SLOTS (default 50)",
        "executorCount, env EXECUTOR_COUNT (default 8)",
        "functionCode.dir, env FUNCTIONS_DIR (default examples/functions, from the current",
        "FUNCTIONS_REDIS_URL",
    ):
        assert text in shown


def test_submit_help_lists_every_builder_and_plugin_with_what_it_takes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        cli.main(["submit", "--help"])
    shown = " ".join(capsys.readouterr().out.split())
    builders, plugins = builder_registry(BLOCK.builders), plugin_registry(BLOCK.plugins)
    assert (len(builders), len(plugins)) == (5, 6)
    for registry in (builders, plugins):
        for name in registry.names():
            implementation = registry.get(name)
            assert implementation is not None
            assert f"{spelled(name)} {implementation.usage}" in shown
    assert 'call_list (callList) payload {"calls":' in shown
    assert 'static config {"function": "module.fn", "args": [...], "count": N}' in shown
    assert 'jsonl config {"path": "FILE"}' in shown


@pytest.mark.parametrize(
    ("message", "flag", "expected"),
    [
        (
            "jsonl: config_json.path is required: the file to append lines to",
            "--plugin-config",
            'jsonl: "path" in --plugin-config is required: the file to append lines to',
        ),
        (
            "static: config_json has unknown key 'cont'; allowed keys: function, count, args",
            "--config",
            "static: --config has unknown key 'cont'; allowed keys: function, count, args",
        ),
        (
            "call_list: payload is not valid JSON",
            "--config",
            "call_list: payload is not valid JSON",
        ),
    ],
)
def test_failure_messages_name_the_flag_that_gave_the_config(
    message: str, flag: str, expected: str
) -> None:
    assert cli.in_flag_terms(message, flag) == expected


def test_a_failed_task_from_flags_is_reported_naming_its_flag(
    capsys: pytest.CaptureFixture[str],
) -> None:
    result = pb.TaskResult(
        phase=pb.TaskPhase.PLUGIN,
        failure_code="PLUGIN_FAILED",
        message="jsonl: config_json.path must be a non-empty string, got 3\ntraceback",
    )
    cli._report_failure("t1", result, {pb.TaskPhase.PLUGIN: "--plugin-config"})
    cli._report_failure("t1", result)  # a task from a file: its fields, as they are
    assert capsys.readouterr().err.splitlines() == [
        'blockx: task t1 failed: PLUGIN_FAILED: jsonl: "path" in --plugin-config must be a '
        "non-empty string, got 3",
        "blockx: task t1 failed: PLUGIN_FAILED: jsonl: config_json.path must be a non-empty "
        "string, got 3",
    ]


def test_serve_runs_the_profile_with_the_flags_as_overrides(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from blockx import app  # noqa: PLC0415  (as the CLI does: only serving needs it)

    runs: list[tuple[object, object, object]] = []

    def fake_run(
        profile: object,
        *,
        overrides: object = None,
        flags: object = None,
        env: object = None,
        file: object = None,
    ) -> int:
        assert flags == cli.SERVE_FLAGS
        runs.append((profile, overrides, file))
        return 0

    monkeypatch.setattr(app, "run", fake_run)

    argv = ["serve", "--profile", "bundle", "--slots", "4", "--functions", "fn", "--executors", "1"]
    assert cli.main(argv) == 0
    assert cli.main(["serve", "--config", "worker.json"]) == 0
    assert runs == [
        (
            PROFILES["bundle"],
            {
                "worker.taskSlots": 4,
                "executorCount": 1,
                "functionCode.dir": "fn",
            },
            None,
        ),
        (PROFILES["block"], {}, "worker.json"),
    ]


def test_serve_help_lists_every_setting_with_its_variable_and_default(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["serve", "--help"])
    assert exited.value.code == 0
    shown = capsys.readouterr().out
    for line in settings.help_lines(WorkerConfig):
        assert line in shown
    assert len(settings.help_lines(WorkerConfig)) == len(settings.table(WorkerConfig).settings)
    assert "  worker.taskSlots  " in shown
    assert "TASK_SLOTS" in shown
    assert "grpcAuthToken" in shown
    assert "(secret)" in shown


def test_print_config_reads_the_config_file_the_flag_names(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "worker.json"
    config.write_text(json.dumps({"worker": {"taskSlots": 7}}))
    assert cli.main(["serve", "--print-config", "--config", str(config), "--executors", "3"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert (printed["worker"]["taskSlots"], printed["executorCount"]) == (7, 3)
    assert "grpcAuthToken" not in printed


# --- submit flags --------------------------------------------------------------------------


SUBMIT = ["submit", "--worker", "127.0.0.1:1", "--task-id", "t1"]


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (
            ["--builder", "x", "--config", "{calls"],
            "blockx: error: --config '{calls': is not valid JSON (",
        ),
        (
            ["--builder", "x", "--config", "[1]"],
            "blockx: error: --config '[1]': must be a JSON object",
        ),
        (
            ["--builder", "x", "--plugin", "log", "--plugin-config", "nope"],
            "blockx: error: --plugin-config 'nope': is not valid JSON (",
        ),
        (
            ["--builder", "x", "--writer", "log", "--writer-config", "nope"],
            "blockx: error: --plugin-config 'nope': is not valid JSON (",
        ),
        (["--builder", "x", "--label", "team"], "blockx: error: --label 'team': must be KEY=VALUE"),
        (
            ["--builder", "x", "--timeout-ms", "-5"],
            "blockx: error: --timeout-ms -5: must be an integer from 0 to",
        ),
        (
            ["--builder", "x", "--max-attempts", "-1"],
            "blockx: error: --max-attempts -1: must be an integer from 0 to",
        ),
        (
            ["--builder", "x", "--plugin-config", "{}"],
            "blockx: error: --plugin-config {}: needs a plugin",
        ),
        (
            ["--builder", "x", "--writer-config", "{}"],
            "blockx: error: --plugin-config {}: needs a plugin",
        ),
    ],
)
def test_submit_flag_errors_exit_1_naming_the_flag(
    flags: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main([*SUBMIT, *flags]) == 1
    assert last_error_line(capsys).startswith(expected)


def test_a_flag_error_carries_the_flag_as_its_field() -> None:
    error = FlagError(field="--label", value="team", allowed="must be KEY=VALUE")
    assert (error.field, error.value, error.allowed) == ("--label", "team", "must be KEY=VALUE")
    assert str(error) == "--label 'team': must be KEY=VALUE"


def test_submit_unreadable_payload_file_names_the_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "missing.bin"
    assert cli.main([*SUBMIT, "--builder", "x", "--payload-file", str(missing)]) == 1
    assert last_error_line(capsys) == (
        f"blockx: error: --payload-file {str(missing)!r}: "
        "cannot be read (No such file or directory)"
    )


def test_submit_task_file_errors_name_the_file_and_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    task_file = tmp_path / "task.json"
    task_file.write_text('{"builder": "x", "retry": {"max_attempts": -2}}', encoding="utf-8")
    assert cli.main([*SUBMIT, "--file", str(task_file)]) == 1
    assert last_error_line(capsys) == (
        f"blockx: error: --file {str(task_file)!r}: task retry.max_attempts = -2: "
        "must be an integer from 0 to 4294967295"
    )


def test_submit_task_file_that_is_not_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    task_file = tmp_path / "task.json"
    task_file.write_text("builder: x\n", encoding="utf-8")
    assert cli.main([*SUBMIT, "--file", str(task_file)]) == 1
    assert "--file" in last_error_line(capsys)


@pytest.mark.parametrize(
    "flags",
    [
        [],  # neither --file nor --builder
        ["--file", "task.json", "--builder", "x"],
        ["--builder", "x", "--payload", "a", "--payload-file", "p"],
        ["--file", "task.json", "--config", "{}"],
        ["--file", "task.json", "--timeout-ms", "0"],
        ["--file", "task.json", "--label", "a=b"],
        ["--file", "task.json", "--plugin", "log"],
        ["--file", "task.json", "--writer", "log"],
        ["--file", "task.json", "--writer-config", "{}"],
        ["--builder", "x", "--timeout-ms", "soon"],
    ],
)
def test_submit_usage_errors_exit_2(flags: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as excinfo:
        cli.main([*SUBMIT, *flags])
    assert excinfo.value.code == 2
    assert "usage:" in capsys.readouterr().err


# --- submit a batch (--file TASKS.jsonl) -----------------------------------------------------


def test_a_batch_file_with_bad_lines_names_each_and_sends_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    batch = tmp_path / "tasks.jsonl"
    batch.write_bytes(
        b'{"task_id": "a", "builder": "static"}\n'
        b"\n"
        b"{not json\n"
        b'{"task_id": "b"}\n'
        b'["a list"]\n'
        b'{"task_id": "a", "builder": "static"}\n'
        b"\xff\xfe\n"
        b'{"task_id": "c", "builder": "static", "timeout_ms": -1}\n'
    )
    # No worker listens at 127.0.0.1:1: reaching for one would fail differently.
    assert cli.main(["submit", "--worker", "127.0.0.1:1", "--file", str(batch)]) == 1
    err = capsys.readouterr().err.splitlines()
    assert [line.split(": ", 2)[1] for line in err[:-1]] == [
        f"{batch} line {number}" for number in (3, 4, 5, 6, 7, 8)
    ]
    assert "is not valid JSON" in err[0]
    assert err[1].endswith("task builder = None: is required")
    assert err[2].endswith("must be a JSON object")
    assert err[3].endswith("task_id 'a' is already on line 1")
    assert "is not UTF-8" in err[4]
    assert err[5].endswith("task timeout_ms = -1: must be an integer from 0 to 9223372036854775807")
    assert err[-1] == (
        f"blockx: error: --file {str(batch)!r}: has 6 bad lines (3, 4, 5, 6, 7, 8); "
        "nothing was sent"
    )


def test_submit_help_says_a_batch_with_a_bad_line_is_refused_whole(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        cli.main(["submit", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "A --file ending in .jsonl (or .ndjson) is a batch" in text
    assert "if any line is bad, each bad line is named on stderr and nothing is sent" in text


def test_a_batch_file_that_is_empty_or_missing_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n", encoding="utf-8")
    assert cli.main(["submit", "--worker", "127.0.0.1:1", "--file", str(empty)]) == 1
    assert last_error_line(capsys) == f"blockx: error: --file {str(empty)!r}: holds no task"
    missing = tmp_path / "missing.jsonl"
    assert cli.main(["submit", "--worker", "127.0.0.1:1", "--file", str(missing)]) == 1
    assert "cannot be read (No such file or directory)" in last_error_line(capsys)


@pytest.mark.parametrize(
    "flags", [["--task-id", "t1"], ["--slot-id", "slot-0"], ["--config", "{}"]]
)
def test_a_batch_file_refuses_flags_that_name_one_task(
    flags: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    batch = tmp_path / "tasks.jsonl"
    batch.write_text('{"task_id": "a", "builder": "static"}\n', encoding="utf-8")
    with pytest.raises(SystemExit) as excinfo:
        cli.main(["submit", "--file", str(batch), *flags])
    assert excinfo.value.code == 2
    assert "usage:" in capsys.readouterr().err


def test_task_specs_from_lines_gives_ids_to_lines_without_one() -> None:
    new_ids = iter(["new-1", "new-2"])
    lines = [b'{"builder": "static"}', b"  ", b'{"task_id": "x", "builder": "static"}', b"{}"[:0]]
    tasks = task_specs_from_lines(lines, new_task_id=lambda: next(new_ids))
    assert [task.task_id for task in tasks] == ["new-1", "x"]
    assert tasks[1] == task_spec("x", builder="static")


def test_task_lines_keep_each_lines_object_as_written() -> None:
    lines = [
        b"",
        b'{"builder": "static", "payload": {"n": 1.10}}',
        b'{"task_id": "x", "builder": "static"}',
    ]
    first, second = task_lines(lines, new_task_id=lambda: "new-1")
    assert (first.number, first.spec.task_id) == (2, "new-1")
    assert first.document == {"builder": "static", "payload": {"n": 1.1}}  # no id added
    assert (second.number, second.document["task_id"]) == (3, "x")


def test_outcome_lines_of_a_batch() -> None:
    kept = pb.TaskResult(
        task_id="a", state=pb.TaskState.SUCCEEDED, outputs_json='[42, {"$bytes": "AP8="}]'
    )
    failed = pb.TaskResult(task_id="b", state=pb.TaskState.FAILED, failure_code="CALL_RAISED")
    refused = WorkerCallError(rpc="RunTasks", status=Status.UNAVAILABLE, message="draining")
    lost = WorkerUnreachable(address="w:1", reason="connection reset")
    outcomes = [
        TaskOutcome(task_id="a", worker_addr="w:1", result=kept),
        TaskOutcome(task_id="b", worker_addr="w:1", result=failed),
        TaskOutcome(task_id="c", worker_addr="w:1", error=refused),
        TaskOutcome(task_id="d", worker_addr="w:1", error=lost),
    ]
    assert [cli.outcome_line(outcome) for outcome in outcomes] == [
        {
            "task_id": "a",
            "state": "SUCCEEDED",
            "failure_code": "",
            "outputs": [42, {"$bytes": "AP8="}],
        },
        {"task_id": "b", "state": "FAILED", "failure_code": "CALL_RAISED"},
        {"task_id": "c", "state": "REFUSED", "status": "UNAVAILABLE", "message": "draining"},
        {
            "task_id": "d",
            "state": "UNKNOWN",
            "message": "cannot reach worker at w:1: connection reset",
        },
    ]


# --- reaching the worker -------------------------------------------------------------------


@pytest.mark.parametrize(
    "command", [["status"], ["result", "t1"], ["watch", "t1"], ["submit", "--builder", "x"]]
)
def test_an_unreachable_worker_exits_1(
    command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    address = f"127.0.0.1:{free_port()}"
    assert cli.main([*command, "--worker", address]) == 1
    assert last_error_line(capsys).startswith(f"blockx: error: cannot reach worker at {address}: ")


def test_a_bad_worker_address_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["status", "--worker", "nowhere"]) == 1
    assert last_error_line(capsys) == ("blockx: error: worker address 'nowhere': must be HOST:PORT")


# --- functions publish still works ---------------------------------------------------------


def test_functions_publish_prints_the_epoch(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    published: list[tuple[str, str, str]] = []

    def fake_publish(directory: str, redis_url: str, prefix: str) -> str:
        published.append((directory, redis_url, prefix))
        return "epoch-1"

    monkeypatch.setattr(cli, "publish_directory", fake_publish)
    argv = ["functions", "publish", "fn", "--redis", "redis://localhost:6379/0", "--prefix", "p:"]
    assert cli.main(argv) == 0
    assert capsys.readouterr().out == "epoch-1\n"
    assert published == [("fn", "redis://localhost:6379/0", "p:")]
