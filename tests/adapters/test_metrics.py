"""The metrics port in-process: Prometheus text, the status page, its WebSocket, bad requests.

Every worker runs with real actors and gRPC and fake executors; `/metrics`
is scraped over HTTP (h11 as the client) and parsed with prometheus-client's
own parser, so names, labels and values are checked as a scraper sees them.
"""

from __future__ import annotations

import collections
import json
import logging
import re
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any

import attrs
import h11
import pytest
import trio
import trio_asyncio
from prometheus_client.parser import text_string_to_metric_families
from trio_websocket import WebSocketConnection, open_websocket_url

from blockx._proto.blockx.worker import v1 as pb
from blockx.observability.history import HISTORY_S
from blockx.observability.status_page import PUSH_INTERVAL_S
from blockx.web import CACHE_CONTROL, asset
from tests.adapters.worker_harness import (
    Harness,
    call_list_task,
    running_worker,
    virtual_clock_config,
    worker_config,
)

SERVICE = "blockx.worker.v1.WorkerService"
TIMEOUT_S = 20


@attrs.frozen
class Reply:
    status: int
    headers: Mapping[str, str]
    body: bytes


async def http(port: int, target: str, *, method: str = "GET") -> Reply:
    """One HTTP/1.1 request to 127.0.0.1:`port`, framed and parsed by h11."""
    client = h11.Connection(h11.CLIENT)
    request = h11.Request(method=method, target=target, headers=[("host", "127.0.0.1")])
    async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
        await stream.send_all(client.send(request) + client.send(h11.EndOfMessage()))
        response: h11.Response | None = None
        body = b""
        while True:
            event = client.next_event()
            if event is h11.NEED_DATA:
                client.receive_data(await stream.receive_some())
            elif isinstance(event, h11.Response):
                response = event
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                break
    assert response is not None
    headers = {key.decode(): value.decode() for key, value in response.headers}
    return Reply(status=response.status_code, headers=headers, body=body)


async def raw_exchange(port: int, data: bytes) -> bytes:
    """Send `data` as it is; everything the server answers until it closes."""
    async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
        await stream.send_all(data)
        answer = b""
        while chunk := await stream.receive_some():
            answer += chunk
    return answer


Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


async def scrape(port: int) -> Samples:
    reply = await http(port, "/metrics")
    assert reply.status == 200
    assert reply.headers["content-type"].startswith("text/plain; version=")
    samples: Samples = {}
    for family in text_string_to_metric_families(reply.body.decode()):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, frozenset(labels.items()))]


def metrics_port(worker: Harness) -> int:
    assert worker.serving.metrics_port is not None
    return worker.serving.metrics_port


async def watch(worker: Harness, *task_ids: str) -> list[pb.TaskUpdate]:
    stream = worker.stub.watch_tasks(pb.WatchTasksRequest(task_ids=list(task_ids)))
    return [update async for update in trio_asyncio.aio_as_trio(stream)]


async def run_to_end(worker: Harness, task: pb.TaskSpec) -> pb.TaskUpdate:
    await worker.call(worker.stub.submit_task, pb.SubmitTaskRequest(task=task))
    updates = await watch(worker, task.task_id)
    assert updates[-1].is_terminal
    return updates[-1]


async def scrape_until(port: int, name: str, expected: float, **labels: str) -> Samples:
    """Scrapes until the sample has `expected` (state the worker reaches a moment later)."""
    while True:
        samples = await scrape(port)
        if samples.get((name, frozenset(labels.items()))) == expected:
            return samples
        await trio.sleep(0.02)


# ---------------------------------------------------------------------- metrics


async def test_finished_tasks_calls_slots_and_rpcs_are_counted_exactly() -> None:
    with trio.fail_after(TIMEOUT_S):
        async with running_worker() as worker:
            port = metrics_port(worker)
            await run_to_end(worker, call_list_task("ok1", ("demo.add", [1, 2])))
            await run_to_end(
                worker, call_list_task("ok2", ("demo.add", [1, 2]), ("demo.add", [3, 4]))
            )
            failed = await run_to_end(worker, call_list_task("bad", ("demo.fail", [])))
            assert failed.result is not None
            assert failed.result.failure_code == "CALL_RAISED"
            await worker.call(
                worker.stub.request_task_slot, pb.RequestTaskSlotRequest(task_id="held")
            )
            await status_of_unknown_task(worker)

            samples = await scrape_until(port, "blockx_watch_streams", 0)
            finished = "blockx_tasks_finished_total"
            assert value(samples, finished, state="SUCCEEDED", failure_code="") == 2
            assert value(samples, finished, state="FAILED", failure_code="CALL_RAISED") == 1
            assert value(samples, "blockx_calls_total", outcome="succeeded") == 3
            assert value(samples, "blockx_calls_total", outcome="failed") == 1
            assert value(samples, "blockx_call_retries_total") == 0
            duration = "blockx_task_duration_seconds_count"
            assert value(samples, duration, state="SUCCEEDED") == 2
            assert value(samples, duration, state="FAILED") == 1
            phases = "blockx_task_phase_duration_seconds_count"
            # The failed task ended in CALLS: it never reached PLUGIN.
            assert {
                phase: value(samples, phases, phase=phase)
                for phase in ("PREPARING", "BUILDER", "CALLS", "PLUGIN")
            } == {"PREPARING": 3, "BUILDER": 3, "CALLS": 3, "PLUGIN": 2}

            assert {
                state: value(samples, "blockx_slots", state=state)
                for state in ("FREE", "ALLOCATED", "RUNNING")
            } == {"FREE": 3, "ALLOCATED": 1, "RUNNING": 0}
            assert value(samples, "blockx_live_tasks", phase="RESERVED") == 1
            assert value(samples, "blockx_live_tasks", phase="CALLS") == 0
            assert value(samples, "blockx_draining") == 0
            assert value(samples, "blockx_retained_results") == 3
            # Each counts 128 bytes and its texts (`TaskResult.retained_bytes`).
            assert 3 * 128 < value(samples, "blockx_retained_result_bytes") < 3 * 256
            assert value(samples, "blockx_executors", state="READY") == 1  # the one fake executor
            assert value(samples, "blockx_executor_restarts_total") == 0
            assert value(samples, "process_resident_memory_bytes") > 0

            rpcs = "blockx_rpc_requests_total"
            assert value(samples, rpcs, service=SERVICE, method="SubmitTask", code="OK") == 3
            assert value(samples, rpcs, service=SERVICE, method="WatchTasks", code="OK") == 3
            assert value(samples, rpcs, service=SERVICE, method="RequestTaskSlot", code="OK") == 1
            assert (
                value(samples, rpcs, service=SERVICE, method="GetTaskResult", code="NOT_FOUND") == 1
            )
            latency = "blockx_rpc_duration_seconds_count"
            assert value(samples, latency, service=SERVICE, method="SubmitTask") == 3
            assert value(samples, latency, service=SERVICE, method="GetTaskResult") == 1


async def status_of_unknown_task(worker: Harness) -> None:
    with pytest.raises(Exception, match="ghost"):
        await worker.call(worker.stub.get_task_result, pb.GetTaskResultRequest(task_id="ghost"))


async def test_a_running_task_an_open_watch_and_drain_show_in_the_gauges() -> None:
    with trio.fail_after(TIMEOUT_S):
        async with running_worker(worker_config(drainTimeoutMs=2_000)) as worker:
            port = metrics_port(worker)
            task = call_list_task("h1", ("demo.hang", []))
            await worker.call(worker.stub.submit_task, pb.SubmitTaskRequest(task=task))
            await worker.calls.hanging.wait()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(watch, worker, "h1")
                samples = await scrape_until(port, "blockx_watch_streams", 1)
                assert value(samples, "blockx_slots", state="RUNNING") == 1
                assert value(samples, "blockx_live_tasks", phase="CALLS") == 1
                assert value(samples, "blockx_draining") == 0

                worker.stop.set()  # drain waits for h1 (2 s): the port still answers
                samples = await scrape_until(port, "blockx_draining", 1)
                assert value(samples, "blockx_slots", state="RUNNING") == 1
                nursery.cancel_scope.cancel()


async def test_two_workers_in_one_process_keep_separate_counts() -> None:
    with trio.fail_after(TIMEOUT_S):
        async with running_worker() as idle, running_worker() as busy:
            # Only the inner harness's channel lives on the current asyncio loop.
            await run_to_end(busy, call_list_task("only-busy", ("demo.add", [1, 1])))
            busy_samples = await scrape(metrics_port(busy))
            idle_samples = await scrape(metrics_port(idle))
            succeeded = frozenset({("state", "SUCCEEDED"), ("failure_code", "")})
            assert busy_samples["blockx_tasks_finished_total", succeeded] == 1
            assert ("blockx_tasks_finished_total", succeeded) not in idle_samples
            assert metrics_port(idle) != metrics_port(busy)


async def test_metrics_listen_addr_none_opens_no_port() -> None:
    with trio.fail_after(TIMEOUT_S):
        async with running_worker(worker_config(metricsListenAddr="none")) as worker:
            assert worker.serving.metrics_port is None
            await run_to_end(worker, call_list_task("t", ("demo.add", [1, 1])))


async def test_memory_diagnostics_log_rss_gc_and_live_tasks(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="blockx.memory")
    with trio.fail_after(TIMEOUT_S):
        async with running_worker(worker_config(memoryDiagnosticsIntervalMs=50)) as worker:
            await run_to_end(worker, call_list_task("t", ("demo.add", [1, 1])))
            await trio.sleep(0.2)
    lines = [record for record in caplog.records if record.name == "blockx.memory"]
    assert len(lines) >= 3  # one at start, then one every 50 ms
    fields: dict[str, Any] = lines[0].__dict__
    assert fields["worker_rss_bytes"] > 0
    assert fields["executors_rss_bytes"] == 0
    assert fields["live_tasks"] == 0
    assert len(fields["gc_pending"]) == 3
    assert "worker rss" in lines[0].getMessage()


# ------------------------------------------------------------------- HTTP edges


async def test_the_status_page_loads_the_shared_assets_which_the_port_serves() -> None:
    with trio.fail_after(TIMEOUT_S):
        async with running_worker() as worker:
            port = metrics_port(worker)
            reply = await http(port, "/")
            assert reply.status == 200
            assert reply.headers["content-type"] == "text/html; charset=utf-8"
            page = reply.body.decode()
            assert "<title>blockx worker</title>" in page
            assert "/ws" in page
            assert re.search(r"\son[a-z]+=", page) is None  # no inline event handlers
            linked = re.findall(r'(?:src|href)="([^"]+)"', page)
            assert linked == [
                "/assets/base.css",
                "/assets/vendor/uplot/uPlot.min.css",
                "/assets/vendor/uplot/uPlot.iife.min.js",
                "/assets/charts.js",
            ]
            for path in linked:
                served = await http(port, path)
                assert served.status == 200, path
                expected = asset(path)
                assert expected is not None
                assert (served.body, served.headers["content-type"]) == expected
                assert served.headers["cache-control"] == CACHE_CONTROL
            assert (await http(port, "/assets/nope.js")).status == 404
            assert (await http(port, "/assets/../status_page.py")).status == 404
            head = await http(port, "/", method="HEAD")
            assert (head.status, head.body) == (200, b"")
            assert head.headers["content-length"] == str(len(reply.body))


async def test_unknown_paths_methods_and_garbage_get_errors_and_the_port_keeps_serving() -> None:
    with trio.fail_after(TIMEOUT_S):
        async with running_worker() as worker:
            port = metrics_port(worker)
            missing = await http(port, "/nope?x=1")
            assert (missing.status, missing.body) == (404, b"not found: /nope\n")
            posted = await http(port, "/metrics", method="POST")
            assert (posted.status, posted.headers["allow"]) == (405, "GET, HEAD")
            plain = await http(port, "/ws")
            assert plain.status == 400
            assert b"WebSocket upgrade" in plain.body
            garbage = await raw_exchange(port, b"\x16\x03\x01 not http at all\r\n\r\n")
            assert garbage.startswith(b"HTTP/1.1 400 ")
            huge = await raw_exchange(port, b"GET / HTTP/1.1\r\nx: " + b"a" * 40_000 + b"\r\n\r\n")
            assert huge.startswith(b"HTTP/1.1 431 ")
            # A client that leaves halfway through its request head.
            async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
                await stream.send_all(b"GET /metr")
            assert (await http(port, "/metrics")).status == 200


# -------------------------------------------------------------------- WebSocket


@asynccontextmanager
async def status_socket(port: int) -> AsyncIterator[WebSocketConnection]:
    async with open_websocket_url(f"ws://127.0.0.1:{port}/ws") as socket:
        yield socket


async def next_snapshot(socket: WebSocketConnection) -> dict[str, Any]:
    message = await socket.get_message()
    assert isinstance(message, str)
    snapshot: dict[str, Any] = json.loads(message)
    return snapshot


async def snapshot_where(
    socket: WebSocketConnection, condition: Callable[[dict[str, Any]], bool]
) -> dict[str, Any]:
    """The first snapshot that meets `condition` (one in flight may predate a change)."""
    while not condition(snapshot := await next_snapshot(socket)):
        pass
    return snapshot


async def test_the_websocket_pushes_snapshots_that_follow_a_task() -> None:
    with trio.fail_after(TIMEOUT_S):
        async with running_worker() as worker, status_socket(metrics_port(worker)) as socket:
            first = await next_snapshot(socket)
            assert first["sequence"] == 1
            assert first["worker"]["worker_addr"] == worker.serving.worker_addr
            assert [slot["state"] for slot in first["slots"]] == ["FREE"] * 4
            assert (first["tasks"], first["recent"], first["draining"]) == ([], [], False)
            assert first["totals"]["tasks_succeeded"] == 0
            assert first["totals"]["retained_results"] == 0
            assert first["totals"]["retained_bytes"] == 0

            # Unchanged state is still pushed, at the push interval.
            again = await next_snapshot(socket)
            assert again["sequence"] == 2
            assert again["at_ms"] - first["at_ms"] >= PUSH_INTERVAL_S * 1000 - 10

            await worker.call(
                worker.stub.request_task_slot, pb.RequestTaskSlotRequest(task_id="held")
            )
            reserved = await snapshot_where(socket, lambda s: bool(s["tasks"]))
            assert reserved["slots"][0] == {
                "slot_id": "slot-0",
                "state": "ALLOCATED",
                "task_id": "held",
            }
            assert [(t["task_id"], t["phase"]) for t in reserved["tasks"]] == [("held", "RESERVED")]

            await run_to_end(worker, call_list_task("t1", ("demo.add", [1, 2])))
            snapshot = await snapshot_where(socket, lambda s: bool(s["recent"]))
            [result] = snapshot["recent"]
            assert (result["task_id"], result["state"], result["calls_total"]) == (
                "t1",
                "SUCCEEDED",
                1,
            )
            assert snapshot["totals"]["tasks_succeeded"] == 1
            assert snapshot["totals"]["retained_results"] == 1
            assert 128 < snapshot["totals"]["retained_bytes"] < 256
            assert snapshot["totals"]["worker_rss_bytes"] > 0


async def test_the_first_snapshot_has_the_whole_history_and_later_ones_its_new_seconds(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running_worker(virtual_clock_config()) as worker:
        port = metrics_port(worker)
        async with status_socket(port) as socket:
            first = await next_snapshot(socket)
            history = first["history"]
            assert (history["full"], history["window_s"], history["step_ms"]) == (
                True,
                HISTORY_S,
                1000,
            )
            assert history["start_ms"] // 1000 == first["worker"]["started_at_ms"] // 1000
            assert history["end_ms"] <= first["at_ms"]
            await run_to_end(worker, call_list_task("ok1", ("demo.add", [1, 2])))
            await run_to_end(
                worker, call_list_task("ok2", ("demo.add", [1, 2]), ("demo.add", [3, 4]))
            )
            await run_to_end(worker, call_list_task("bad", ("demo.fail", [])))
            # Later snapshots add the seconds closed since the one before, end to end.
            added: dict[str, list[Any]] = collections.defaultdict(list)
            end_ms = history["end_ms"]
            while sum(added["succeeded"]) + sum(added["failed"]) < 3:
                update = (await next_snapshot(socket))["history"]
                assert (update["full"], update["start_ms"]) == (False, end_ms)
                assert len(json.dumps(update)) < 1_000
                end_ms = update["end_ms"]
                for series in ("succeeded", "failed", "calls", "p50_ms", "p99_ms"):
                    added[series] += update[series]
            assert (sum(added["succeeded"]), sum(added["failed"]), sum(added["calls"])) == (
                2,
                1,
                4,
            )
            assert [p50 for p50 in added["p50_ms"] if p50 is not None] != []

        # A page opened later gets every second so far in its first snapshot.
        async with status_socket(port) as late:
            opened = await next_snapshot(late)
            history = opened["history"]
            assert history["full"] is True
            assert (sum(history["succeeded"]), sum(history["failed"])) == (2, 1)
            assert len(json.dumps(opened)) < 20_000
