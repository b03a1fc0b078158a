"""Trace spans of tasks: one root span "task" per task, one child span per phase.

Owns the tracer a worker uses (`open_tracing`) and the open spans of its live
tasks (`TaskTracing`). With an OTLP endpoint configured the tracer comes from
an SDK `TracerProvider` that exports in batches over OTLP/HTTP (a background
thread, which is shut down and flushed when the worker stops; its failures are
logged at most once a minute, see `span_export`); without one it is the API's
no-op tracer: no SDK object, no thread, and the task actor's calls cost a
method call each.

Must never set the global tracer provider (the tracer is handed to the
slot-table actor, so two workers in one process never share one) and never
block the Trio thread on an export: spans end in memory and the shutdown
flush runs in a worker thread under a deadline.

Spans: "task" (`blockx.task_id`, `blockx.slot_id`, `blockx.task_code_epoch`,
`blockx.task_state`, `blockx.failure_code`, `blockx.retryable`; status ERROR
when the task failed) and one child per phase it reached: "builder"
(`blockx.call_count`), "calls" (`blockx.calls_total`/`_succeeded`/`_failed`/
`_retried`, `blockx.output_count`, `blockx.output_bytes`) and "plugin"
(`blockx.plugin`, `blockx.records_written`). The slot-table actor, which sees
every transition, reports them: a task started, its epoch pinned, a phase
started or ended, the task finished. A phase cut short by the task's end is
ended then, marked `blockx.cut_short`.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Final

import trio
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Span, Status, StatusCode, Tracer

from blockx.calls import CallPhaseOutcome
from blockx.slots import PhaseOutcome, TaskPhase, TaskResult, TaskState

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

logger = logging.getLogger("blockx.tracing")

INSTRUMENTATION_NAME: Final = "blockx"
TRACES_PATH: Final = "/v1/traces"
SHUTDOWN_GRACE_S: Final = 5.0
"""How long the final flush of spans may take when the worker stops."""


class _NotTraced:
    """What a task that is not traced reports to: nothing happens."""

    def epoch_pinned(self, task_code_epoch: str) -> None:
        pass

    def phase_started(self, phase: TaskPhase, plugin: str) -> None:
        pass

    def phase_ended(self, outcome: PhaseOutcome | CallPhaseOutcome) -> None:
        pass


_NOT_TRACED: Final = _NotTraced()


class _TaskTrace(_NotTraced):
    """The spans of one task: its root and the span of the phase it is in."""

    def __init__(self, tracer: Tracer, root: Span) -> None:
        self._tracer = tracer
        self._root = root
        self._phase: Span | None = None

    def epoch_pinned(self, task_code_epoch: str) -> None:
        self._root.set_attribute("blockx.task_code_epoch", task_code_epoch)

    def phase_started(self, phase: TaskPhase, plugin: str) -> None:
        self._end_phase(cut_short=True)
        span = self._tracer.start_span(
            phase.value.lower(),
            context=trace.set_span_in_context(self._root, otel_context.Context()),
        )
        if phase is TaskPhase.PLUGIN:
            span.set_attribute("blockx.plugin", plugin)
        self._phase = span

    def phase_ended(self, outcome: PhaseOutcome | CallPhaseOutcome) -> None:
        span = self._phase
        if span is None:
            return
        span.set_attribute("blockx.ok", outcome.ok)
        match outcome:
            case CallPhaseOutcome(stats=stats):
                span.set_attributes(
                    {
                        "blockx.calls_total": stats.calls_total,
                        "blockx.calls_succeeded": stats.calls_succeeded,
                        "blockx.calls_failed": stats.calls_failed,
                        "blockx.calls_retried": stats.calls_retried,
                        "blockx.output_count": outcome.output_count,
                        "blockx.output_bytes": outcome.output_bytes,
                    }
                )
            case PhaseOutcome(call_count=call_count, plugin_results=plugin_results):
                if call_count:
                    span.set_attribute("blockx.call_count", call_count)
                if plugin_results:
                    written = sum(result.records_written for result in plugin_results)
                    span.set_attribute("blockx.records_written", written)
        if not outcome.ok:
            if outcome.failure_code:
                span.set_attribute("blockx.failure_code", outcome.failure_code)
            span.set_status(Status(StatusCode.ERROR, outcome.message or None))
        self._end_phase(cut_short=False)

    def finish(self, result: TaskResult) -> None:
        self._end_phase(cut_short=True)
        root = self._root
        root.set_attributes(
            {
                "blockx.task_state": result.state.value,
                "blockx.failure_code": result.failure_code or "",
                "blockx.retryable": result.retryable,
                "blockx.task_code_epoch": result.task_code_epoch,
            }
        )
        if result.state is TaskState.FAILED:
            root.set_status(Status(StatusCode.ERROR, result.failure_code or None))
        root.end()

    def abandon(self) -> None:
        self._end_phase(cut_short=True)
        self._root.set_attribute("blockx.cut_short", True)
        self._root.end()

    def _end_phase(self, *, cut_short: bool) -> None:
        span, self._phase = self._phase, None
        if span is None:
            return
        if cut_short:
            span.set_attribute("blockx.cut_short", True)
        span.end()


class TaskTracing:
    """The open spans of a worker's live tasks, keyed by task id. Touched only from the
    Trio thread (by the slot-table actor); without a real tracer every call returns at once."""

    def __init__(self, tracer: Tracer) -> None:
        self.tracer = tracer
        self.enabled = not isinstance(tracer, trace.NoOpTracer)
        self._open: dict[str, _TaskTrace] = {}

    @classmethod
    def disabled(cls) -> TaskTracing:
        """Records nothing: a worker without an endpoint."""
        return cls(trace.NoOpTracer())

    def task_started(self, task_id: str, slot_id: str) -> None:
        """Open the task's root span."""
        if not self.enabled:
            return
        stale = self._open.pop(task_id, None)
        if stale is not None:  # cannot happen while the slot table ends every task it starts
            stale.abandon()
        root = self.tracer.start_span(
            "task",
            context=otel_context.Context(),
            attributes={"blockx.task_id": task_id, "blockx.slot_id": slot_id},
        )
        self._open[task_id] = _TaskTrace(self.tracer, root)

    def epoch_pinned(self, task_id: str, task_code_epoch: str) -> None:
        """The task's function-code epoch is known."""
        self._open.get(task_id, _NOT_TRACED).epoch_pinned(task_code_epoch)

    def phase_started(self, task_id: str, phase: TaskPhase, plugin: str = "") -> None:
        """`phase` starts (`plugin`: the result handler's type, for the plugin phase)."""
        self._open.get(task_id, _NOT_TRACED).phase_started(phase, plugin)

    def phase_ended(self, task_id: str, outcome: PhaseOutcome | CallPhaseOutcome) -> None:
        """The phase started last ended with `outcome`."""
        self._open.get(task_id, _NOT_TRACED).phase_ended(outcome)

    def task_finished(self, result: TaskResult) -> None:
        """End the task's spans with its result (a slot table `on_finished` hook)."""
        recording = self._open.pop(result.task_id, None)
        if recording is not None:
            recording.finish(result)

    @property
    def open_tasks(self) -> int:
        return len(self._open)

    def close(self) -> None:
        """End the spans of tasks that never saw their result (the worker stopped abruptly)."""
        open_traces, self._open = self._open, {}
        for recording in open_traces.values():
            recording.abandon()


def traces_url(endpoint: str) -> str:
    """The OTLP/HTTP traces URL of `endpoint`, a base URL as OTEL_EXPORTER_OTLP_ENDPOINT is.

    A URL that already ends in /v1/traces is taken as it is.
    """
    base = endpoint.rstrip("/")
    return base if base.endswith(TRACES_PATH) else base + TRACES_PATH


def sdk_provider(endpoint: str, *, service: str, version: str) -> TracerProvider:
    """An SDK provider exporting to `endpoint` in batches over OTLP/HTTP; starts a thread.

    The OTLP exporter is wrapped in a `ThrottledSpanExporter`, so a collector
    that cannot be reached costs the log one WARNING a minute.
    """
    # Imported here: a worker without an endpoint never loads the SDK.
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # noqa: PLC0415
        OTLPSpanExporter,
    )
    from opentelemetry.sdk.resources import Resource  # noqa: PLC0415
    from opentelemetry.sdk.trace import TracerProvider  # noqa: PLC0415
    from opentelemetry.sdk.trace.export import BatchSpanProcessor  # noqa: PLC0415

    from blockx.observability.span_export import ThrottledSpanExporter  # noqa: PLC0415

    resource = Resource.create({"service.name": service, "service.version": version})
    # shutdown_on_exit=False: the worker shuts it down itself, off the Trio thread.
    provider = TracerProvider(resource=resource, shutdown_on_exit=False)
    url = traces_url(endpoint)
    exporter = ThrottledSpanExporter(OTLPSpanExporter(endpoint=url), url=url)
    provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


@contextlib.asynccontextmanager
async def open_tracing(
    endpoint: str, *, service: str, version: str, tracer: Tracer | None = None
) -> AsyncIterator[TaskTracing]:
    """The worker's `TaskTracing` for its lifetime.

    `tracer` (tests) is used as it is, and its provider is the caller's to shut
    down. Otherwise a non-empty `endpoint` makes an SDK provider (`sdk_provider`),
    flushed and shut down on exit; an empty one the no-op tracer.
    """
    if tracer is not None or not endpoint:
        tracing = TaskTracing(tracer) if tracer is not None else TaskTracing.disabled()
        try:
            yield tracing
        finally:
            tracing.close()
        return
    provider = sdk_provider(endpoint, service=service, version=version)
    logger.info("tracing: exporting spans to %s", traces_url(endpoint))
    tracing = TaskTracing(provider.get_tracer(INSTRUMENTATION_NAME, version))
    try:
        yield tracing
    finally:
        tracing.close()
        with trio.move_on_after(SHUTDOWN_GRACE_S, shield=True) as waited:
            await trio.to_thread.run_sync(provider.shutdown, abandon_on_cancel=True)
        if waited.cancelled_caught:
            logger.warning("tracing: spans not flushed within %s s; dropped", SHUTDOWN_GRACE_S)
