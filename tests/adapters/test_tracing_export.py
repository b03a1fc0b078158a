"""A span exporter that cannot reach its collector: its failures are logged at most once a minute.

The throttling is driven by a fake exporter and a clock the test moves; the
real OTLP/HTTP exporter is pointed at a closed loopback port with a short
export timeout, so it fails at once (connection refused, no backoff sleep).
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Iterator, Sequence

import pytest
import trio
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from blockx.observability.span_export import (
    SDK_EXPORT_LOGGERS,
    FailureThrottle,
    LogFailure,
    ThrottledSpanExporter,
)
from blockx.observability.tracing import open_tracing, traces_url

SDK_LOGGER = logging.getLogger(SDK_EXPORT_LOGGERS[0])
URL = "http://collector:4318/v1/traces"


class FakeClock:
    def __init__(self) -> None:
        self.now_s = 1_000.0

    def __call__(self) -> float:
        return self.now_s


class FlakyExporter(SpanExporter):
    """Fails (logging as the SDK's exporter does, traceback included) until told to work."""

    def __init__(self) -> None:
        self.working = False
        self.batches = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.batches += 1
        if self.working:
            return SpanExportResult.SUCCESS
        SDK_LOGGER.warning("Transient error %s, retrying in %.2fs.", "Service Unavailable", 1.0)
        try:
            raise ConnectionRefusedError(111, "Connection refused")
        except ConnectionRefusedError:
            SDK_LOGGER.exception("Failed to export %s batch", "spans")
        return SpanExportResult.FAILURE

    def shutdown(self) -> None:
        pass


class RaisingExporter(SpanExporter):
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        raise RuntimeError("encoder broke\non two lines")

    def shutdown(self) -> None:
        pass


@pytest.fixture
def spans() -> Iterator[list[ReadableSpan]]:
    provider = TracerProvider(shutdown_on_exit=False)
    span = provider.get_tracer("test").start_span("task")
    span.end()
    assert isinstance(span, ReadableSpan)
    yield [span]
    provider.shutdown()


@pytest.fixture
def closed_port() -> int:
    """A loopback port nothing listens on: bound, then released."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def blockx_lines(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    return [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "blockx.tracing"]


def assert_no_sdk_records_nor_traceback(caplog: pytest.LogCaptureFixture) -> None:
    assert [r.name for r in caplog.records if r.name.startswith("opentelemetry")] == []
    assert [r.getMessage() for r in caplog.records if r.exc_info or r.exc_text] == []
    assert "Traceback" not in caplog.text


def test_many_failures_within_a_minute_make_one_warning_then_one_with_the_count(
    caplog: pytest.LogCaptureFixture, spans: list[ReadableSpan]
) -> None:
    caplog.set_level(logging.DEBUG)
    clock, flaky = FakeClock(), FlakyExporter()
    exporter = ThrottledSpanExporter(flaky, url=URL, clock=clock)
    for _ in range(50):
        assert exporter.export(spans) is SpanExportResult.FAILURE
        clock.now_s += 1.0  # the 50th failure is 49 s after the first
    reason = (
        "Failed to export spans batch: ConnectionRefusedError: [Errno 111] Connection refused"
        " (first: Transient error Service Unavailable, retrying in 1.00s.)"
    )
    assert blockx_lines(caplog) == [
        (logging.WARNING, f"tracing: exporting spans to {URL} failed: {reason}")
    ]
    clock.now_s = 1_060.0
    exporter.export(spans)
    assert blockx_lines(caplog)[1:] == [
        (
            logging.WARNING,
            f"tracing: exporting spans to {URL} failed: {reason}"
            " (49 more failures in the last 60 s)",
        )
    ]
    assert flaky.batches == 51
    assert_no_sdk_records_nor_traceback(caplog)
    exporter.shutdown()


def test_a_recovery_is_logged_once_and_a_flapping_collector_still_once_a_minute(
    caplog: pytest.LogCaptureFixture, spans: list[ReadableSpan]
) -> None:
    caplog.set_level(logging.DEBUG)
    clock, flaky = FakeClock(), FlakyExporter()
    exporter = ThrottledSpanExporter(flaky, url=URL, clock=clock)
    exporter.export(spans)
    exporter.export(spans)
    flaky.working = True
    assert exporter.export(spans) is SpanExportResult.SUCCESS
    exporter.export(spans)
    for _ in range(3):  # it fails and works again, all within the minute
        clock.now_s += 10.0
        flaky.working = False
        exporter.export(spans)
        flaky.working = True
        exporter.export(spans)
    assert [level for level, _ in blockx_lines(caplog)] == [logging.WARNING, logging.INFO]
    assert blockx_lines(caplog)[1][1] == (
        f"tracing: exporting spans to {URL} works again (after 2 failed exports)"
    )
    clock.now_s = 1_060.0
    flaky.working = False
    exporter.export(spans)
    assert blockx_lines(caplog)[2][1].endswith("(4 more failures in the last 60 s)")
    assert_no_sdk_records_nor_traceback(caplog)
    exporter.shutdown()


def test_failures_not_logged_yet_are_counted_when_the_exporter_shuts_down(
    caplog: pytest.LogCaptureFixture, spans: list[ReadableSpan]
) -> None:
    clock = FakeClock()
    exporter = ThrottledSpanExporter(RaisingExporter(), url=URL, clock=clock)
    for _ in range(3):
        assert exporter.export(spans) is SpanExportResult.FAILURE
    clock.now_s += 5.0
    exporter.shutdown()
    failed = f"tracing: exporting spans to {URL} failed: RuntimeError: encoder broke on two lines"
    assert blockx_lines(caplog) == [
        (logging.WARNING, failed),
        (logging.WARNING, f"{failed} (2 more failures in the last 5 s)"),
    ]
    assert_no_sdk_records_nor_traceback(caplog)


def test_sdk_records_outside_an_export_pass_and_the_filter_goes_with_shutdown(
    caplog: pytest.LogCaptureFixture,
) -> None:
    exporter = ThrottledSpanExporter(FlakyExporter(), url=URL, clock=FakeClock())
    SDK_LOGGER.warning("not part of an export")
    exporter.shutdown()
    assert [r.getMessage() for r in caplog.records if r.name == SDK_LOGGER.name] == [
        "not part of an export"
    ]
    assert all(not logging.getLogger(name).filters for name in SDK_EXPORT_LOGGERS)


def test_another_threads_sdk_records_pass_while_an_export_runs(
    caplog: pytest.LogCaptureFixture, spans: list[ReadableSpan]
) -> None:
    class LogsFromAnotherThread(FlakyExporter):
        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            other = threading.Thread(target=SDK_LOGGER.warning, args=("another exporter's",))
            other.start()
            other.join()
            return super().export(spans)

    exporter = ThrottledSpanExporter(LogsFromAnotherThread(), url=URL, clock=FakeClock())
    exporter.export(spans)
    exporter.shutdown()
    assert [r.getMessage() for r in caplog.records if r.name == SDK_LOGGER.name] == [
        "another exporter's"
    ]


def test_the_throttle_counts_unlogged_failures_between_warnings() -> None:
    throttle = FailureThrottle(interval_s=60.0)
    assert throttle.failed(0.0) == LogFailure(unlogged=0, window_s=0.0)
    assert [throttle.failed(now_s) for now_s in (1.0, 30.0, 59.999)] == [None] * 3
    assert throttle.failed(60.0) == LogFailure(unlogged=3, window_s=60.0)
    assert throttle.succeeded() == 5
    assert throttle.succeeded() is None
    assert throttle.closing(70.0) is None


def test_the_real_otlp_exporter_at_a_closed_port_logs_one_line_without_a_traceback(
    caplog: pytest.LogCaptureFixture, spans: list[ReadableSpan], closed_port: int
) -> None:
    caplog.set_level(logging.DEBUG)
    url = traces_url(f"http://127.0.0.1:{closed_port}")
    # A timeout shorter than the first backoff: the exporter gives up at once, without sleeping.
    exporter = ThrottledSpanExporter(OTLPSpanExporter(endpoint=url, timeout=0.5), url=url)
    for _ in range(5):
        assert exporter.export(spans) is SpanExportResult.FAILURE
    exporter.shutdown()
    lines = blockx_lines(caplog)
    assert len(lines) == 2, lines  # the first failure, and the four since at shutdown
    assert lines[0] == (
        logging.WARNING,
        f"tracing: exporting spans to {url} failed:"
        " Failed to export spans batch due to timeout, max retries or shutdown.",
    )
    assert lines[1][1].startswith(lines[0][1] + " (4 more failures in the last ")
    assert_no_sdk_records_nor_traceback(caplog)


async def test_a_worker_with_an_unreachable_collector_logs_the_failed_flush_once(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch, closed_port: int
) -> None:
    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "0.5")
    endpoint = f"http://127.0.0.1:{closed_port}"
    with trio.fail_after(10):
        async with open_tracing(endpoint, service="svc", version="1") as tracing:
            for name in ("task", "builder", "calls"):
                tracing.tracer.start_span(name).end()
    # The batch processor's thread exported once, on the final flush, and failed.
    assert blockx_lines(caplog) == [
        (logging.INFO, f"tracing: exporting spans to {traces_url(endpoint)}"),
        (
            logging.WARNING,
            f"tracing: exporting spans to {traces_url(endpoint)} failed:"
            " Failed to export spans batch due to timeout, max retries or shutdown.",
        ),
    ]
    assert_no_sdk_records_nor_traceback(caplog)
