"""Structured logs: the exact JSON and text lines, task context and the task_finished line."""

from __future__ import annotations

import datetime
import io
import json
import logging
import sys
from collections.abc import Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from blockx.calls import CallStats, FailureCode
from blockx.observability.logs import (
    HELD_LINES,
    RESULT_MESSAGE_LIMIT_CHARS,
    JsonFormatter,
    TaskContextFilter,
    TaskLog,
    TextFormatter,
    flush_logs,
    lean_records,
    log_task_finished,
    setup_logging,
    task_logger,
    utc_timestamp,
)
from blockx.slots import PhaseTimings, TaskPhase, TaskResult, TaskState

CREATED_S = 1_700_000_000.123
CREATED_TEXT = "2023-11-14T22:13:20.123Z"


def record(msg: str = "phase %s done", *args: object, **fields: object) -> logging.LogRecord:
    return logging.makeLogRecord(
        {
            "name": "blockx.task",
            "levelno": logging.INFO,
            "levelname": "INFO",
            "msg": msg,
            "args": args,
            "created": CREATED_S,
            **fields,
        }
    )


def failing_record() -> logging.LogRecord:
    try:
        raise ValueError("boom")
    except ValueError:
        return record("it broke", exc_info=sys.exc_info())


class Lines:
    """Every line a logger writes, through `formatter`."""

    def __init__(self, formatter: logging.Formatter) -> None:
        self.stream = io.StringIO()
        self.handler = logging.StreamHandler(self.stream)
        self.handler.setFormatter(formatter)

    def json(self) -> list[dict[str, object]]:
        return [json.loads(line) for line in self.stream.getvalue().splitlines()]


@pytest.fixture
def task_lines() -> Iterator[Lines]:
    """What `blockx.task` logs at INFO and above, as JSON; the logger is left as it was."""
    lines = Lines(JsonFormatter())
    level = task_logger.level
    task_logger.addHandler(lines.handler)
    task_logger.setLevel(logging.INFO)
    yield lines
    task_logger.removeHandler(lines.handler)
    task_logger.setLevel(level)


@pytest.fixture
def root_logger() -> Iterator[logging.Logger]:
    """The root logger; its handlers and level are restored after the test."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield root
    for handler in root.handlers:
        if handler not in handlers:
            root.removeHandler(handler)
            handler.close()
    root.setLevel(level)


# --- JSON ----------------------------------------------------------------------------------


def test_a_json_line_has_the_fixed_fields_then_the_context_fields() -> None:
    line = JsonFormatter().format(record("phase %s done", "BUILDER", task_id="t1", slot_id="s0"))
    assert "\n" not in line
    parsed = json.loads(line)
    assert list(parsed) == ["ts", "level", "logger", "msg", "task_id", "slot_id"]
    assert parsed == {
        "ts": CREATED_TEXT,
        "level": "INFO",
        "logger": "blockx.task",
        "msg": "phase BUILDER done",
        "task_id": "t1",
        "slot_id": "s0",
    }


def test_a_json_line_carries_the_exception_as_text_on_one_line() -> None:
    line = JsonFormatter().format(failing_record())
    assert "\n" not in line
    parsed = json.loads(line)
    assert list(parsed) == ["ts", "level", "logger", "msg", "exc"]
    assert parsed["msg"] == "it broke"
    exc = parsed["exc"]
    assert isinstance(exc, str)
    assert exc.startswith("Traceback (most recent call last):\n")
    assert exc.endswith("ValueError: boom")


def test_a_context_field_named_like_a_fixed_key_and_odd_values_stay_readable() -> None:
    parsed = json.loads(
        JsonFormatter().format(
            record("x", ts="mine", phase=TaskPhase.CALLS, raw=b"\x00", ok=True, n=3)
        )
    )
    assert parsed["ts"] == CREATED_TEXT
    assert parsed["ts_"] == "mine"
    assert parsed["phase"] == "CALLS"
    assert parsed["raw"] == "b'\\x00'"
    assert (parsed["ok"], parsed["n"]) == (True, 3)


# --- text ----------------------------------------------------------------------------------


def test_a_text_line_has_the_message_then_key_value_fields() -> None:
    line = TextFormatter().format(
        record("phase %s done", "CALLS", task_id="t1", note="two words", empty="")
    )
    assert line == (
        f'{CREATED_TEXT} INFO blockx.task: phase CALLS done task_id=t1 note="two words" empty=""'
    )


def test_a_text_line_puts_the_traceback_on_the_lines_after() -> None:
    first, *rest = TextFormatter().format(failing_record()).split("\n")
    assert first == f"{CREATED_TEXT} INFO blockx.task: it broke"
    assert rest[0] == "Traceback (most recent call last):"
    assert rest[-1] == "ValueError: boom"


# --- setup ---------------------------------------------------------------------------------


def test_setup_logging_installs_one_handler_in_the_chosen_format(
    root_logger: logging.Logger,
) -> None:
    first = io.StringIO()
    setup_logging("text", stream=first)
    second = io.StringIO()
    handler = setup_logging("json", logging.WARNING, stream=second)
    assert [h for h in root_logger.handlers if type(h) is type(handler)] == [handler]
    assert root_logger.level == logging.WARNING

    logging.getLogger("blockx.test").info("not shown")
    logging.getLogger("blockx.test").warning("worker ready on %s", "127.0.0.1:1")
    assert first.getvalue() == ""
    (line,) = second.getvalue().splitlines()
    parsed = json.loads(line)
    assert (parsed["level"], parsed["logger"]) == ("WARNING", "blockx.test")
    assert parsed["msg"] == "worker ready on 127.0.0.1:1"


def test_held_lines_go_out_together_on_flush_and_a_warning_takes_them_along(
    root_logger: logging.Logger,
) -> None:
    out = io.StringIO()
    setup_logging("text", stream=out, hold=True)
    log = logging.getLogger("blockx.test")
    log.info("one")
    log.info("two")
    assert out.getvalue() == ""  # held
    flush_logs()
    assert [line.split()[-1] for line in out.getvalue().splitlines()] == ["one", "two"]

    log.info("three")
    log.warning("four")  # at once, after what was held
    assert [line.split()[-1] for line in out.getvalue().splitlines()] == [
        "one",
        "two",
        "three",
        "four",
    ]
    for index in range(HELD_LINES):
        log.info("n%d", index)
    assert out.getvalue().splitlines()[-1].endswith(f"n{HELD_LINES - 1}")  # a full hold


def test_setup_logging_refuses_an_unknown_format(root_logger: logging.Logger) -> None:
    with pytest.raises(ValueError, match="'xml': must be one of auto, json, text"):
        setup_logging("xml")


# --- task context --------------------------------------------------------------------------


def test_every_line_of_a_task_log_carries_the_task_fields(task_lines: Lines) -> None:
    log = TaskLog(task_logger, task_id="t1", slot_id="slot-0")
    log.info("activated")
    log.set_phase("CALLS")
    log.set_epoch("e7")
    log.warning("calls slow", extra={"calls_total": 3})
    first, second = task_lines.json()
    assert {k: first[k] for k in ("task_id", "slot_id", "phase", "task_code_epoch")} == {
        "task_id": "t1",
        "slot_id": "slot-0",
        "phase": "",
        "task_code_epoch": "",
    }
    assert {k: second[k] for k in ("phase", "task_code_epoch", "calls_total")} == {
        "phase": "CALLS",
        "task_code_epoch": "e7",
        "calls_total": 3,
    }
    assert "calls_total" not in log.fields


def test_lines_logged_inside_a_bound_task_carry_its_fields(task_lines: Lines) -> None:
    task_lines.handler.addFilter(TaskContextFilter())
    plugin = logging.getLogger("blockx.task.plugin")
    log = TaskLog(task_logger, task_id="t2", slot_id="slot-1")
    log.set_phase("PLUGIN")
    with log.bound():
        plugin.info("wrote %d records", 2)
        plugin.info("own fields win", extra={"phase": "mine"})
    plugin.info("after the task")
    inside, own, after = task_lines.json()
    assert (inside["msg"], inside["task_id"], inside["slot_id"], inside["phase"]) == (
        "wrote 2 records",
        "t2",
        "slot-1",
        "PLUGIN",
    )
    assert own["phase"] == "mine"
    assert "task_id" not in after


def test_the_task_finished_line_carries_the_results_statistics(task_lines: Lines) -> None:
    long_message = "x" * (RESULT_MESSAGE_LIMIT_CHARS + 5)
    log_task_finished(
        TaskResult(
            task_id="t1",
            slot_id="slot-2",
            state=TaskState.FAILED,
            phase=TaskPhase.CALLS,
            failure_code=FailureCode.CALL_RAISED,
            message=long_message,
            retryable=True,
            output_count=2,
            output_bytes=40,
            call_stats=CallStats(calls_total=3, calls_succeeded=2, calls_failed=1, calls_retried=4),
            timings=PhaseTimings(
                preparing_ms=1, builder_ms=2, calls_ms=30, plugin_ms=0, total_ms=33
            ),
            task_code_epoch="e1",
            accepted_at_ms=1_000,
            finished_at_ms=1_033,
        )
    )
    (line,) = task_lines.json()
    del line["ts"]
    assert line == {
        "level": "INFO",
        "logger": "blockx.task",
        "msg": "task_finished",
        "task_id": "t1",
        "slot_id": "slot-2",
        "phase": "CALLS",
        "task_code_epoch": "e1",
        "state": "FAILED",
        "failure_code": "CALL_RAISED",
        "result_message": "x" * RESULT_MESSAGE_LIMIT_CHARS
        + f"... ({RESULT_MESSAGE_LIMIT_CHARS + 5} chars)",
        "retryable": True,
        "preparing_ms": 1,
        "builder_ms": 2,
        "calls_ms": 30,
        "plugin_ms": 0,
        "total_ms": 33,
        "calls_total": 3,
        "calls_succeeded": 2,
        "calls_failed": 1,
        "calls_retried": 4,
        "output_count": 2,
        "output_bytes": 40,
        "accepted_at_ms": 1_000,
        "finished_at_ms": 1_033,
    }


def test_the_task_finished_line_of_a_success_has_an_empty_failure_code(
    task_lines: Lines,
) -> None:
    log_task_finished(
        TaskResult(
            task_id="t2",
            slot_id="slot-0",
            state=TaskState.SUCCEEDED,
            phase=TaskPhase.TERMINAL,
            output_count=1,
            output_bytes=3,
            call_stats=CallStats(calls_total=1, calls_succeeded=1),
            timings=PhaseTimings(preparing_ms=1, builder_ms=1, calls_ms=5, plugin_ms=2, total_ms=9),
            task_code_epoch="e2",
            accepted_at_ms=2_000,
            finished_at_ms=2_009,
        )
    )
    (line,) = task_lines.json()
    del line["ts"]
    assert line == {
        "level": "INFO",
        "logger": "blockx.task",
        "msg": "task_finished",
        "task_id": "t2",
        "slot_id": "slot-0",
        "phase": "TERMINAL",
        "task_code_epoch": "e2",
        "state": "SUCCEEDED",
        "failure_code": "",
        "result_message": "",
        "retryable": False,
        "preparing_ms": 1,
        "builder_ms": 1,
        "calls_ms": 5,
        "plugin_ms": 2,
        "total_ms": 9,
        "calls_total": 1,
        "calls_succeeded": 1,
        "calls_failed": 0,
        "calls_retried": 0,
        "output_count": 1,
        "output_bytes": 3,
        "accepted_at_ms": 2_000,
        "finished_at_ms": 2_009,
    }


def test_lean_records_leave_every_field_of_both_formats(root_logger: logging.Logger) -> None:
    saved = (logging.logThreads, logging.logProcesses, logging.logMultiprocessing)
    saved_srcfile = logging._srcfile
    try:
        lean_records()
        for log_format in ("json", "text"):
            out = io.StringIO()
            setup_logging(log_format, stream=out)
            logging.getLogger("blockx.test").warning("ready on %s", "h:1", extra={"slot": 3})
            line = out.getvalue()
            assert "ready on h:1" in line
            assert "blockx.test" in line
            assert "WARNING" in line
            assert "slot" in line
            assert "3" in line
        assert (
            logging.getLogger("blockx.test")
            .makeRecord("x", logging.INFO, "f", 1, "m", (), None)
            .threadName
            is None
        )  # nothing was looked up
    finally:
        logging.logThreads, logging.logProcesses, logging.logMultiprocessing = saved
        logging._srcfile = saved_srcfile


def _timestamp_by_datetime(created_s: float) -> str:
    moment = datetime.datetime.fromtimestamp(created_s, tz=datetime.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


@given(st.floats(min_value=0, max_value=4_102_444_800, allow_nan=False))
def test_a_timestamp_is_what_datetime_makes_of_the_same_time(created_s: float) -> None:
    assert utc_timestamp(created_s) == _timestamp_by_datetime(created_s)


@pytest.mark.parametrize("created_s", [1_700_000_000.9999996, 1_700_000_000.0004999, 59.9995])
def test_a_timestamp_rounds_like_datetime_across_a_second(created_s: float) -> None:
    assert utc_timestamp(created_s) == _timestamp_by_datetime(created_s)
    assert utc_timestamp(created_s + 1) == _timestamp_by_datetime(created_s + 1)


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("terminal", [True, False])
def test_auto_logs_text_to_a_terminal_and_json_lines_elsewhere(
    terminal: bool, root_logger: logging.Logger
) -> None:
    stream = Terminal() if terminal else io.StringIO()
    setup_logging("auto", stream=stream)
    logging.getLogger("blockx.test").warning("hello")
    line = stream.getvalue().strip()
    if terminal:
        assert line.endswith("hello")
        assert not line.startswith("{")
    else:
        assert json.loads(line)["msg"] == "hello"
