"""Span export whose failures reach the worker's log at most once a minute.

Owns `ThrottledSpanExporter`, the exporter the worker's batch processor calls:
it hands each batch to the OTLP exporter and reports a failed export as one
WARNING on "blockx.tracing" (the endpoint and the reason, no traceback), then
at most one more per `FAILURE_LOG_INTERVAL_S`, saying how many failures went
unlogged in between; an INFO line says when exporting works again. When a
collector is down the SDK's exporter would log three to four lines per batch
on its own logger (a "retrying" WARNING per backoff, then an ERROR), and the
processor a traceback for any exporter that raises.

Silencing the SDK, and why this way: `SdkExportRecords` is a `logging.Filter`
put on the SDK exporter's own loggers (`SDK_EXPORT_LOGGERS`) that holds back
only the records logged on a thread while that thread is inside one of our
exports, and hands them to the export as the account of what went wrong.
Raising those loggers' level would be global to the process, would also hide
what the SDK logs outside an export (its configuration warnings), and would
lose the reason. The processor's logger needs nothing: `export` never raises.

Must never raise out of `export`, never read a clock but the injected one,
and never hold back a record that is not part of one of its own exports.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Final

import attrs
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

logger = logging.getLogger("blockx.tracing")

FAILURE_LOG_INTERVAL_S: Final = 60.0
"""After a failure is logged, the next one is logged no sooner than this."""
SDK_EXPORT_LOGGERS: Final = (
    # The OTLP/HTTP span exporter's module logger, which it also hands to its HTTP client.
    "opentelemetry.exporter.otlp.proto.http.trace_exporter",
    # The HTTP client's own logger, used by a client not given one.
    "opentelemetry.exporter.otlp.common.http",
)
NO_REASON: Final = "the exporter reported a failure and logged nothing"


@attrs.frozen(kw_only=True)
class LogFailure:
    """Log this failure, with the `unlogged` ones of the `window_s` seconds before it."""

    unlogged: int
    window_s: float


class FailureThrottle:
    """Which export failures to log: the first, then at most one per `interval_s`.

    Pure: `now_s` (a monotonic reading in seconds) is an argument. The interval
    runs across recoveries, so a collector that comes and goes is still logged
    at most once per interval.
    """

    def __init__(self, interval_s: float = FAILURE_LOG_INTERVAL_S) -> None:
        self.interval_s = interval_s
        self._logged_at_s: float | None = None
        self.unlogged = 0
        self.failed_since_working = 0
        self._warned_since_working = False

    def failed(self, now_s: float) -> LogFailure | None:
        """An export failed at `now_s`: what to log, or None to count it unlogged."""
        self.failed_since_working += 1
        last = self._logged_at_s
        if last is not None and now_s - last < self.interval_s:
            self.unlogged += 1
            return None
        window_s = 0.0 if last is None else now_s - last
        notice = LogFailure(unlogged=self.unlogged, window_s=window_s)
        self._logged_at_s = now_s
        self.unlogged = 0
        self._warned_since_working = True
        return notice

    def succeeded(self) -> int | None:
        """An export worked: the failures before it, when a warning about them was logged."""
        failures, warned = self.failed_since_working, self._warned_since_working
        self.failed_since_working = 0
        self._warned_since_working = False
        return failures if warned else None

    def closing(self, now_s: float) -> LogFailure | None:
        """The exporter stops: the failures not logged yet, if any."""
        if not self.unlogged or self._logged_at_s is None:
            return None
        notice = LogFailure(unlogged=self.unlogged, window_s=now_s - self._logged_at_s)
        self.unlogged = 0
        return notice


class SdkExportRecords(logging.Filter):
    """On the SDK exporter's loggers: holds back the records logged on a thread that is
    inside `capture()`, collecting them there; every other record passes."""

    def __init__(self, logger_names: Sequence[str] = SDK_EXPORT_LOGGERS) -> None:
        super().__init__()
        self.logger_names = tuple(logger_names)
        self._local = threading.local()

    def filter(self, record: logging.LogRecord) -> bool:
        held: list[logging.LogRecord] | None = getattr(self._local, "held", None)
        if held is None:
            return True
        held.append(record)
        return False

    @contextlib.contextmanager
    def capture(self) -> Iterator[list[logging.LogRecord]]:
        """The records the SDK logs on this thread until the block ends."""
        held: list[logging.LogRecord] = []
        self._local.held = held
        try:
            yield held
        finally:
            self._local.held = None

    def install(self) -> None:
        for name in self.logger_names:
            logging.getLogger(name).addFilter(self)

    def remove(self) -> None:
        for name in self.logger_names:
            logging.getLogger(name).removeFilter(self)


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _record_text(record: logging.LogRecord) -> str:
    text = record.getMessage()
    if record.exc_info and record.exc_info[1] is not None:
        error = record.exc_info[1]
        text = f"{text}: {type(error).__name__}: {error}"
    return _one_line(text)


def failure_reason(records: Sequence[logging.LogRecord], raised: Exception | None = None) -> str:
    """Why an export failed, in one line: what the exporter raised, else the last
    thing it logged and, when it logged more, the first (the error that started it)."""
    if raised is not None:
        return _one_line(f"{type(raised).__name__}: {raised}")
    if not records:
        return NO_REASON
    first, last = _record_text(records[0]), _record_text(records[-1])
    return last if first == last else f"{last} (first: {first})"


class ThrottledSpanExporter(SpanExporter):
    """Hands batches to `delegate` and logs its failures at most once per interval.

    Spans go out exactly as `delegate` sends them. `url` is what the log lines
    name; `clock` is a monotonic clock in seconds. The filter on the SDK's
    loggers is put there now and taken off by `shutdown`. What the SDK logs in
    an export that worked in the end (a retry that got through) is dropped.
    """

    def __init__(
        self,
        delegate: SpanExporter,
        *,
        url: str,
        clock: Callable[[], float] = time.monotonic,
        interval_s: float = FAILURE_LOG_INTERVAL_S,
    ) -> None:
        self._delegate = delegate
        self.url = url
        self._clock = clock
        self._throttle = FailureThrottle(interval_s)
        self._last_reason = NO_REASON
        # The batch processor exports from its thread and from force_flush/shutdown callers.
        self._lock = threading.Lock()
        self._sdk_records = SdkExportRecords()
        self._sdk_records.install()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with self._lock:
            raised: Exception | None = None
            with self._sdk_records.capture() as records:
                try:
                    result = self._delegate.export(spans)
                except Exception as error:  # the processor would log it with a traceback
                    raised, result = error, SpanExportResult.FAILURE
            if result is SpanExportResult.SUCCESS:
                self._export_worked()
            else:
                self._export_failed(failure_reason(records, raised))
            return result

    def _export_failed(self, reason: str) -> None:
        self._last_reason = reason
        notice = self._throttle.failed(self._clock())
        if notice is not None:
            self._warn(notice)

    def _export_worked(self) -> None:
        failures = self._throttle.succeeded()
        if failures is not None:
            logger.info(
                "tracing: exporting spans to %s works again (after %d failed exports)",
                self.url,
                failures,
            )

    def _warn(self, notice: LogFailure) -> None:
        if notice.unlogged:
            logger.warning(
                "tracing: exporting spans to %s failed: %s (%d more failures in the last %.0f s)",
                self.url,
                self._last_reason,
                notice.unlogged,
                notice.window_s,
            )
        else:
            logger.warning("tracing: exporting spans to %s failed: %s", self.url, self._last_reason)

    def shutdown(self) -> None:
        """Shut `delegate` down, log the failures not logged yet, take the filter off."""
        try:
            with self._lock:
                self._delegate.shutdown()
                notice = self._throttle.closing(self._clock())
                if notice is not None:
                    self._warn(notice)
        finally:
            self._sdk_records.remove()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return self._delegate.force_flush(timeout_millis)
