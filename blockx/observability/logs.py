"""Structured logs: the worker's log formats, its one logging setup, and task context.

Owns the JSON formatter (one object per line: `ts`, `level`, `logger`, `msg`,
then every context field a record carries, then `exc`/`stack` as text), the
text formatter (the same fields as `key=value` after the message),
`setup_logging` (called once by the worker process after its configuration
is loaded), `TaskLog` (puts `task_id`, `slot_id`, `phase` and
`task_code_epoch` on every line about a task) and the `task_finished` line.

A task actor binds its `TaskLog` for its whole life (`TaskLog.bound`), in a
context variable, so each Trio task has its own; the `TaskContextFilter` on the
worker's handler adds those fields to any line logged from inside the actor
(a builder's, a plugin's) that does not carry them itself.

Must never log from a formatter, never raise out of one on an odd value (a
value JSON cannot hold is written as its `str`), and never touch a handler it
did not install: test runners keep theirs on the root logger.
"""

from __future__ import annotations

import contextlib
import contextvars
import datetime
import enum
import functools
import json
import logging
import sys
from collections.abc import Iterator, Mapping, MutableMapping
from typing import Any, Final, TextIO

from blockx.settings import LOG_FORMATS
from blockx.slots import RUN_PHASES, TaskResult

TASK_FINISHED: Final = "task_finished"
"""The message of the line logged once per task when it reaches its terminal result."""
RESULT_MESSAGE_LIMIT_CHARS: Final = 1_000
"""A result's message (it may hold a traceback) is cut to this many characters."""

task_logger = logging.getLogger("blockx.task")

# Attributes every LogRecord has; anything else on a record came in through `extra=`.
_RECORD_ATTRIBUTES: Final = frozenset(
    vars(logging.LogRecord("", logging.INFO, "", 0, "", (), None))
) | {"message", "asctime", "taskName"}
_FIXED_KEYS: Final = frozenset({"ts", "level", "logger", "msg", "exc", "stack"})
_task_fields: contextvars.ContextVar[Mapping[str, object] | None] = contextvars.ContextVar(
    "blockx_task_log_fields", default=None
)


def context_fields(record: logging.LogRecord) -> dict[str, object]:
    """The fields a record carries beyond the standard ones (its `extra=`)."""
    return {
        key: value
        for key, value in vars(record).items()
        if key not in _RECORD_ATTRIBUTES and key[0] != "_"
    }


def utc_timestamp(created_s: float) -> str:
    """ISO 8601 in UTC with milliseconds: 2025-01-02T03:04:05.678Z (what `datetime` makes
    of `created_s`; the part up to the second is made once per second)."""
    second = int(created_s)
    micros = round((created_s - second) * 1_000_000)  # as datetime.fromtimestamp rounds
    if micros >= 1_000_000:
        second += 1
        micros -= 1_000_000
    return f"{_second_text(second)}.{micros // 1000:03d}Z"


@functools.lru_cache(maxsize=1)
def _second_text(second: int) -> str:
    moment = datetime.datetime.fromtimestamp(second, tz=datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S")


def _plain(value: object) -> object:
    if isinstance(value, enum.Enum):
        return value.value
    return str(value)


def _exception_text(formatter: logging.Formatter, record: logging.LogRecord) -> str | None:
    # Cached on the record as logging.Formatter does, so a second handler reuses it.
    if record.exc_info and not record.exc_text:
        record.exc_text = formatter.formatException(record.exc_info)
    return record.exc_text or None


_LINE_ENCODER: Final = json.JSONEncoder(default=_plain)
"""One encoder for every line (`json.dumps` with `default` makes a new one per call)."""


class JsonFormatter(logging.Formatter):
    """One JSON object per line; a context field named like a fixed key gets a "_" suffix."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "ts": utc_timestamp(record.created),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        fields = context_fields(record)
        if _FIXED_KEYS.isdisjoint(fields):
            line.update(fields)
        else:
            for key, value in fields.items():
                line[f"{key}_" if key in _FIXED_KEYS else key] = value
        exc = _exception_text(self, record)
        if exc is not None:
            line["exc"] = exc
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        return _LINE_ENCODER.encode(line)


class TextFormatter(logging.Formatter):
    """`ts LEVEL logger: msg key=value ...`, then the traceback on the lines after."""

    def format(self, record: logging.LogRecord) -> str:
        parts = [
            utc_timestamp(record.created),
            record.levelname,
            f"{record.name}:",
            record.getMessage(),
        ]
        parts.extend(f"{key}={_text_value(value)}" for key, value in context_fields(record).items())
        text = " ".join(parts)
        exc = _exception_text(self, record)
        if exc is not None:
            text += "\n" + exc
        if record.stack_info:
            text += "\n" + self.formatStack(record.stack_info)
        return text


def _text_value(value: object) -> str:
    shown = value if isinstance(value, str) else str(_plain(value))
    if shown and not any(char.isspace() or char in '"=' for char in shown):
        return shown
    return json.dumps(shown)


class TaskContextFilter(logging.Filter):
    """Adds the fields of the task bound in the current context to a record that lacks them."""

    def filter(self, record: logging.LogRecord) -> bool:
        fields = _task_fields.get()
        if fields:
            attributes = vars(record)
            for key, value in fields.items():
                attributes.setdefault(key, value)
        return True


class _WorkerHandler(logging.StreamHandler[TextIO]):
    """The handler `setup_logging` installs; a later call replaces it and only it.

    With `hold` set, lines below WARNING are kept and written together (one
    write for many lines, where a busy worker logged one write per task): by
    `flush`, which the process then calls every `LOG_FLUSH_S`, or once
    `HELD_LINES` are kept. A WARNING or worse goes out at once, after what was
    kept, so the order of lines holds. Without `hold` each line goes out at once.
    """

    def __init__(self, stream: TextIO, *, hold: bool) -> None:
        super().__init__(stream)
        self._hold = hold
        self._held: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._held.append(self.format(record) + self.terminator)
            if not self._hold or record.levelno >= logging.WARNING or len(self._held) >= HELD_LINES:
                self.flush()
        except Exception:  # logging's own rule: a broken line must not break the caller
            self.handleError(record)

    def flush(self) -> None:
        with self.lock:  # type: ignore[union-attr]  # made by Handler.__init__
            if self._held:
                text = "".join(self._held)
                self._held.clear()
                self.stream.write(text)
            self.stream.flush()


LOG_FLUSH_S: Final = 0.1
"""How long a held log line may wait (see `setup_logging(hold=True)`)."""
HELD_LINES: Final = 256


def flush_logs() -> None:
    """Write every line the installed handler holds."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler, _WorkerHandler):
            handler.flush()


def lean_records() -> None:
    """Stop logging from looking up, for every record, what neither format shows: the
    thread, the process and the calling function (the logging HOWTO's "Optimization").
    Process-wide: for the worker's own process, not for a library's caller."""
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    logging._srcfile = None


def setup_logging(
    log_format: str,
    level: int = logging.INFO,
    *,
    stream: TextIO | None = None,
    hold: bool = False,
) -> logging.Handler:
    """Send every log line to `stream` (stderr) in `log_format` from `level`: "json", "text",
    or "auto" (text when `stream` is a terminal, JSON lines otherwise).

    `hold`: lines below WARNING may wait up to `LOG_FLUSH_S`; the caller must
    then call `flush_logs` that often (logging flushes at exit on its own).
    Calling it again replaces the handler it installed before; other handlers stay.
    """
    out = sys.stderr if stream is None else stream
    if log_format == "auto":
        log_format = "text" if out.isatty() else "json"
    formatter: logging.Formatter
    if log_format == "json":
        formatter = JsonFormatter()
    elif log_format == "text":
        formatter = TextFormatter()
    else:
        raise ValueError(f"log format {log_format!r}: must be one of {', '.join(LOG_FORMATS)}")
    handler = _WorkerHandler(out, hold=hold)
    handler.setFormatter(formatter)
    handler.addFilter(TaskContextFilter())
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _WorkerHandler)]:
        root.removeHandler(old)
        old.close()
    root.addHandler(handler)
    root.setLevel(level)
    return handler


class TaskLog(logging.LoggerAdapter[logging.Logger]):
    """`logger` with the task's fields on every line.

    `phase` and `task_code_epoch` start empty ("" until known) and are set by
    the task actor as it runs (`set_phase`, `set_epoch`); `extra=` of a call
    adds to them.
    """

    def __init__(self, logger: logging.Logger, *, task_id: str, slot_id: str) -> None:
        self.fields: dict[str, object] = {
            "task_id": task_id,
            "slot_id": slot_id,
            "phase": "",
            "task_code_epoch": "",
        }
        super().__init__(logger, self.fields)

    def set_phase(self, phase: str) -> None:
        self.fields["phase"] = phase

    def set_epoch(self, task_code_epoch: str) -> None:
        self.fields["task_code_epoch"] = task_code_epoch

    @contextlib.contextmanager
    def bound(self) -> Iterator[None]:
        """Within: lines logged in this context carry the task's fields (`TaskContextFilter`)."""
        token = _task_fields.set(self.fields)
        try:
            yield
        finally:
            _task_fields.reset(token)

    def process(
        self, msg: Any, kwargs: MutableMapping[str, Any]
    ) -> tuple[Any, MutableMapping[str, Any]]:
        extra: Mapping[str, object] | None = kwargs.get("extra")
        kwargs["extra"] = {**self.fields, **extra} if extra else self.fields
        return msg, kwargs


_PHASE_MS_KEYS: Final = tuple((phase, f"{phase.value.lower()}_ms") for phase in RUN_PHASES)


def task_finished_fields(result: TaskResult) -> dict[str, object]:
    """The statistics of a terminal result, as the `task_finished` line carries them.

    `result_message` is the result's message cut to `RESULT_MESSAGE_LIMIT_CHARS`
    ("message" is a name logging keeps for itself).
    """
    timings = result.timings
    stats = result.call_stats
    message = result.message
    if len(message) > RESULT_MESSAGE_LIMIT_CHARS:
        message = f"{message[:RESULT_MESSAGE_LIMIT_CHARS]}... ({len(result.message)} chars)"
    return {
        "task_id": result.task_id,
        "slot_id": result.slot_id,
        "phase": result.phase.value,
        "task_code_epoch": result.task_code_epoch,
        "state": result.state.value,
        "failure_code": result.failure_code or "",
        "result_message": message,
        "retryable": result.retryable,
        **{key: timings.ms(phase) for phase, key in _PHASE_MS_KEYS},
        "total_ms": timings.total_ms,
        "calls_total": stats.calls_total,
        "calls_succeeded": stats.calls_succeeded,
        "calls_failed": stats.calls_failed,
        "calls_retried": stats.calls_retried,
        "output_count": result.output_count,
        "output_bytes": result.output_bytes,
        "accepted_at_ms": result.accepted_at_ms,
        "finished_at_ms": result.finished_at_ms,
    }


def log_task_finished(result: TaskResult) -> None:
    """The `task_finished` line of `result` (a slot table `on_finished` hook).

    Once per task, so the record is made here with its fields set at once, not by
    `Logger.info(extra=)`, which checks each of them for a clash; none of them is
    named like a `LogRecord` attribute."""
    if task_logger.isEnabledFor(logging.INFO):
        record = logging.getLogRecordFactory()(
            task_logger.name, logging.INFO, "", 0, TASK_FINISHED, None, None
        )
        vars(record).update(task_finished_fields(result))
        task_logger.handle(record)
