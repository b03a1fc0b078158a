"""Trace spans of an in-process worker: a "task" span per task with one child per phase.

Spans go to the SDK's in-memory exporter through a provider the test owns and
passes in; nothing sets the global tracer provider.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
import trio
import trio_asyncio
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace import Tracer as SdkTracer
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from blockx._proto.blockx.worker import v1 as pb
from blockx.observability import tracing
from blockx.observability.tracing import open_tracing, traces_url
from blockx.slots import PhaseOutcome, TaskPhase
from tests.adapters.worker_harness import Harness, call_list_task, running_worker, worker_config

BATCH_THREAD = "OtelBatchSpanRecordProcessor"


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    yield exporter
    exporter.shutdown()


@pytest.fixture
def provider(exporter: InMemorySpanExporter) -> Iterator[TracerProvider]:
    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider
    provider.shutdown()


async def run_to_end(worker: Harness, task: pb.TaskSpec) -> pb.TaskUpdate:
    await worker.call(worker.stub.submit_task, pb.SubmitTaskRequest(task=task))
    stream = worker.stub.watch_tasks(pb.WatchTasksRequest(task_ids=[task.task_id]))
    final: pb.TaskUpdate | None = None
    async for update in trio_asyncio.aio_as_trio(stream):
        assert isinstance(update, pb.TaskUpdate)
        final = update
    assert final is not None
    assert final.is_terminal
    return final


def by_name(spans: tuple[ReadableSpan, ...]) -> dict[str, ReadableSpan]:
    named = {span.name: span for span in spans}
    assert len(named) == len(spans), [span.name for span in spans]
    return named


def parent_of(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


def span_id(span: ReadableSpan) -> int:
    assert span.context is not None
    value: int = span.context.span_id
    return value


def attribute(span: ReadableSpan, key: str) -> object:
    assert span.attributes is not None
    return span.attributes.get(key)


async def test_a_task_has_a_root_span_with_a_child_per_phase(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    with trio.fail_after(10):
        async with running_worker(tracer=provider.get_tracer("test")) as worker:
            task = call_list_task(
                "traced",
                ("demo.add", [1, 2]),
                ("demo.add", [3, 4]),
                result_handler=pb.ResultHandler(type="test"),
            )
            final = await run_to_end(worker, task)
            assert final.state == pb.TaskState.SUCCEEDED

    spans = by_name(exporter.get_finished_spans())
    assert set(spans) == {"task", "builder", "calls", "plugin"}
    root = spans["task"]
    assert root.parent is None
    assert root.attributes == {
        "blockx.task_id": "traced",
        "blockx.slot_id": "slot-0",
        "blockx.task_code_epoch": final.result.task_code_epoch if final.result else None,
        "blockx.task_state": "SUCCEEDED",
        "blockx.failure_code": "",
        "blockx.retryable": False,
    }
    assert root.status.status_code is StatusCode.UNSET
    for name in ("builder", "calls", "plugin"):
        assert parent_of(spans[name]) == span_id(root)
        assert spans[name].context is not None
        assert root.context is not None
        assert spans[name].context.trace_id == root.context.trace_id
        assert attribute(spans[name], "blockx.ok") is True
    assert attribute(spans["builder"], "blockx.call_count") == 2
    assert {
        key: attribute(spans["calls"], f"blockx.{key}")
        for key in (
            "calls_total",
            "calls_succeeded",
            "calls_failed",
            "calls_retried",
            "output_count",
        )
    } == {
        "calls_total": 2,
        "calls_succeeded": 2,
        "calls_failed": 0,
        "calls_retried": 0,
        "output_count": 2,
    }
    assert attribute(spans["plugin"], "blockx.plugin") == "test"
    assert attribute(spans["plugin"], "blockx.records_written") == 2
    starts = [spans[name].start_time or 0 for name in ("builder", "calls", "plugin")]
    assert starts == sorted(starts)


async def test_a_failed_task_ends_its_spans_with_the_failure(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    with trio.fail_after(10):
        async with running_worker(tracer=provider.get_tracer("test")) as worker:
            final = await run_to_end(worker, call_list_task("bad", ("demo.fail", [])))
            assert final.state == pb.TaskState.FAILED

    spans = by_name(exporter.get_finished_spans())
    assert set(spans) == {"task", "builder", "calls"}
    root = spans["task"]
    assert attribute(root, "blockx.task_state") == "FAILED"
    assert attribute(root, "blockx.failure_code") == "CALL_RAISED"
    assert root.status.status_code is StatusCode.ERROR
    assert spans["calls"].status.status_code is StatusCode.ERROR
    assert attribute(spans["calls"], "blockx.failure_code") == "CALL_RAISED"
    assert attribute(spans["calls"], "blockx.calls_failed") == 1


async def test_a_phase_cut_short_by_the_task_deadline_ends_with_the_task(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    with trio.fail_after(10):
        async with running_worker(tracer=provider.get_tracer("test")) as worker:
            task = call_list_task("slow", ("demo.hang", []), task_timeout_ms=300)
            final = await run_to_end(worker, task)
            assert final.state == pb.TaskState.FAILED

    spans = by_name(exporter.get_finished_spans())
    assert set(spans) == {"task", "builder", "calls"}
    assert attribute(spans["calls"], "blockx.cut_short") is True
    assert attribute(spans["task"], "blockx.task_state") == "FAILED"
    assert (spans["calls"].end_time or 0) <= (spans["task"].end_time or 0)


async def test_without_an_endpoint_no_sdk_provider_is_made(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    made: list[str] = []

    def refuse(endpoint: str, **kwargs: object) -> TracerProvider:
        made.append(endpoint)
        raise AssertionError("no SDK provider without an endpoint")

    monkeypatch.setattr(tracing, "sdk_provider", refuse)
    with trio.fail_after(10):
        async with running_worker(worker_config(otelExporterEndpoint="")) as worker:
            final = await run_to_end(worker, call_list_task("plain", ("demo.add", [1, 1])))
            assert final.state == pb.TaskState.SUCCEEDED
            assert BATCH_THREAD not in {thread.name for thread in threading.enumerate()}
        async with open_tracing("", service="s", version="v") as disabled:
            assert isinstance(disabled.tracer, trace.NoOpTracer)
            assert not disabled.enabled
            disabled.task_started("t", "slot-0")
            disabled.epoch_pinned("t", "epoch-1")
            disabled.phase_started("t", TaskPhase.BUILDER)
            disabled.phase_ended("t", PhaseOutcome(ok=True))
            assert disabled.open_tasks == 0
    assert made == []


async def test_an_endpoint_makes_a_batch_exporting_provider_that_stops_with_the_worker() -> None:
    with trio.fail_after(10):
        async with open_tracing("http://127.0.0.1:1/", service="svc", version="1.2") as enabled:
            assert enabled.enabled
            assert isinstance(enabled.tracer, SdkTracer)
            assert enabled.tracer.resource.attributes["service.name"] == "svc"
            assert BATCH_THREAD in {thread.name for thread in threading.enumerate()}
        assert BATCH_THREAD not in {thread.name for thread in threading.enumerate()}
    # Nothing installed a global provider: the API's default is still its proxy.
    assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)


def test_the_traces_url_follows_the_otlp_endpoint_convention() -> None:
    assert traces_url("http://collector:4318") == "http://collector:4318/v1/traces"
    assert traces_url("http://collector:4318/") == "http://collector:4318/v1/traces"
    assert traces_url("http://collector:4318/v1/traces") == "http://collector:4318/v1/traces"
