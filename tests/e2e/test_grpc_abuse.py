"""The gRPC port holds under abuse, against a real worker process: a stream beyond
grpcMaxConcurrentStreams is refused, a connection beyond grpcMaxConnections closed, an
idle connection closed after grpcIdleTimeoutMs, a client resetting more streams than
grpcMaxResets dropped; and a rapid-reset flood from one connection is dropped at a small
cost while a normal client runs tasks at its usual pace."""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.request
from typing import Any

import h2.errors
import h2.events
import trio

from blockx._proto.blockx.worker import v1 as pb
from blockx.client import WorkerClient
from tests.e2e.serve_process import REPO, free_port, serve_process
from tests.raw_http2 import End, RawConnection, framed, grpc_headers

TIMEOUT_S = 60
RUN_TASKS = grpc_headers("RunTasks")
"""A bidirectional call: its stream stays open until the client ends it."""


def reset_pairs(raw: RawConnection, count: int) -> None:
    """`count` streams opened and reset at once, in one write."""
    for _ in range(count):
        raw.h2.reset_stream(raw.open_stream(RUN_TASKS), h2.errors.ErrorCodes.CANCEL)
    raw.flush()


def status_call(raw: RawConnection) -> bytes | End:
    """The grpc-status a GetWorkerStatus call on `raw` ends with, or how the connection
    ended before it was answered."""
    stream_id = raw.open_stream(grpc_headers("GetWorkerStatus"))
    raw.h2.send_data(stream_id, framed(b""), end_stream=True)
    raw.flush()
    trailers = raw.read_until(
        lambda e: isinstance(e, h2.events.TrailersReceived) and e.stream_id == stream_id
    )
    if isinstance(trailers, End):
        return trailers
    assert isinstance(trailers, h2.events.TrailersReceived)
    return dict(trailers.headers or [])[b"grpc-status"]


async def test_a_stream_beyond_the_cap_is_refused_and_the_connection_lives() -> None:
    env = {"WORKER_GRPC_MAX_CONCURRENT_STREAMS": "4"}
    with trio.fail_after(TIMEOUT_S):
        async with serve_process("--executors", "1", env=env) as worker:

            def five_streams() -> tuple[int, list[int], bool]:
                with RawConnection(worker.port) as raw:
                    # Sent before the server's SETTINGS are read: h2 itself would keep to them.
                    streams = [raw.open_stream(RUN_TASKS) for _ in range(5)]
                    raw.flush()
                    reset = raw.read_until(lambda e: isinstance(e, h2.events.StreamReset))
                    assert isinstance(reset, h2.events.StreamReset), reset
                    refused = [streams.index(reset.stream_id), reset.error_code]
                    advertised = raw.h2.remote_settings.max_concurrent_streams
                    return advertised, refused, raw.ping()

            advertised, refused, alive = await trio.to_thread.run_sync(five_streams)
    assert advertised == 4
    assert refused == [4, h2.errors.ErrorCodes.REFUSED_STREAM]  # the fifth
    assert alive


async def test_a_connection_beyond_the_cap_is_closed_at_once() -> None:
    metrics_port = free_port()
    env = {"WORKER_GRPC_MAX_CONNECTIONS": "2", "METRICS_LISTEN": f"127.0.0.1:{metrics_port}"}
    with trio.fail_after(TIMEOUT_S):
        async with serve_process("--executors", "1", env=env) as worker:

            def three_connections() -> tuple[End, bool]:
                with RawConnection(worker.port) as first, RawConnection(worker.port) as second:
                    first.settle()
                    second.settle()
                    with RawConnection(worker.port) as third:
                        end = third.end()
                    return end, first.ping() and second.ping()

            end, kept = await trio.to_thread.run_sync(three_connections)
            assert (end.goaway, end.debug) == (h2.errors.ErrorCodes.NO_ERROR, b"refused")
            assert kept
            await worker.wait_for_line("closed (refused): 2 connections are open already")
            # Their places are free again once the worker has seen the two go (a connection
            # that comes before is refused as the third was).
            refused = 1
            while (answer := await trio.to_thread.run_sync(_fresh_call, worker.port)) != b"0":
                assert answer == end
                refused += 1
            closed = await trio.to_thread.run_sync(_closed_counts, metrics_port)
    assert closed == {"refused": refused, "abuse": 0.0, "idle": 0.0}


def _fresh_call(port: int) -> bytes | End:
    """`status_call` on a new connection."""
    with RawConnection(port) as raw:
        try:
            return status_call(raw)
        except ConnectionError:  # refused before the call went out: its GOAWAY is to read
            return raw.end()


async def test_a_connection_without_an_open_stream_is_closed_after_the_idle_timeout() -> None:
    timeout_s = 0.5
    env = {"WORKER_GRPC_IDLE_TIMEOUT_MS": str(int(timeout_s * 1000))}
    with trio.fail_after(TIMEOUT_S):
        async with serve_process("--executors", "1", env=env) as worker:

            def idle_for(connection: RawConnection | None = None) -> tuple[End, float]:
                """How `connection` (a new one if None), idle from now, ends, and when."""
                started = time.monotonic()
                with connection or RawConnection(worker.port) as idle:
                    return idle.end(), time.monotonic() - started

            def busy_then_idle() -> list[tuple[End, float] | bool]:
                with RawConnection(worker.port) as busy:
                    stream_id = busy.open_stream(RUN_TASKS)  # right behind the preface
                    busy.flush()
                    busy.settle()
                    seen: list[tuple[End, float] | bool] = [idle_for(), idle_for()]
                    # (two idle timeouts have passed)
                    seen.append(busy.ping())  # still open: it has a stream open
                    busy.h2.reset_stream(stream_id, h2.errors.ErrorCodes.CANCEL)
                    seen.append(idle_for(busy))  # idle from its stream's end on
                    return seen

            *idle, still_open, freed = await trio.to_thread.run_sync(busy_then_idle)
    assert still_open is True
    for seen in (*idle, freed):
        assert isinstance(seen, tuple)
        end, after_s = seen
        assert (end.goaway, end.debug) == (h2.errors.ErrorCodes.NO_ERROR, b"idle")
        # Wall-clock of a real process: never before the timeout, never far beyond it.
        assert timeout_s <= after_s < timeout_s + 5


async def test_resets_up_to_the_limit_are_served_and_one_more_drops_the_connection() -> None:
    limit = 50
    env = {"WORKER_GRPC_MAX_RESETS": str(limit)}  # within the default 10 s window
    with trio.fail_after(TIMEOUT_S):
        async with serve_process("--executors", "1", env=env) as worker:

            def resets(count: int) -> bytes | End:
                with RawConnection(worker.port) as raw:
                    raw.settle()
                    reset_pairs(raw, count)
                    return status_call(raw)

            at_limit = await trio.to_thread.run_sync(resets, limit)
            over = await trio.to_thread.run_sync(resets, limit + 1)
            await worker.wait_for_line(f"closed (abuse): it reset more than {limit} streams")
    assert at_limit == b"0"  # the call after them answered
    assert over == End(goaway=h2.errors.ErrorCodes.ENHANCE_YOUR_CALM, debug=b"abuse")


# --- the flood -----------------------------------------------------------------------------

FLOOD_PAIRS = 10_000
NORMAL_TASKS = 300
"""Tasks the normal client runs, one at a time, in each phase (p99: the 3rd slowest)."""
P99_FLOOR_S = 0.02
"""Added to twice the quiet p99 (about 6 ms): the flood's own process takes one of the
2 cores while it runs, which costs the tasks beside it a few ms that are the machine's,
not the worker's (measured: 10 to 14 ms under the flood); and on a loaded machine one
scheduling delay costs a task that much, abuse or none."""
FLOOD_CPU_BOUND_S = 0.3
"""Worker CPU a flood on its own may cost. Measured on 2 cores: 0.05 to 0.06 s; with
grpcMaxResets lifted its 10,000 pairs cost 0.49 s (and the worker before it had any of
these limits spent 1.41 s on 20,000)."""


async def test_a_rapid_reset_flood_is_dropped_and_a_normal_client_keeps_its_pace() -> None:
    metrics_port = free_port()
    env = {"METRICS_LISTEN": f"127.0.0.1:{metrics_port}"}
    with trio.fail_after(120):
        async with serve_process("--executors", "1", env=env) as worker:
            pid = worker.process.pid
            floods: list[dict[str, Any]] = []
            before = cpu_seconds(pid)
            await _flood(worker.port, floods)  # alone, for the worker's CPU
            flood_cpu_s = cpu_seconds(pid) - before
            async with WorkerClient.connect(f"127.0.0.1:{worker.port}") as client:
                await run_tasks(client, "warm", 30)
                quiet = await run_tasks(client, "quiet", NORMAL_TASKS)
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(_flood, worker.port, floods)
                    loaded = await run_tasks(client, "loaded", NORMAL_TASKS)
            closed = await trio.to_thread.run_sync(_closed_counts, metrics_port)
    for flood in floods:
        assert flood["closed"], flood
        assert flood["goaway"] == h2.errors.ErrorCodes.ENHANCE_YOUR_CALM, flood
    assert closed["abuse"] == 2.0
    assert flood_cpu_s < FLOOD_CPU_BOUND_S
    assert len(quiet) == len(loaded) == NORMAL_TASKS
    assert p99(loaded) <= 2 * p99(quiet) + P99_FLOOR_S, (p99(quiet), p99(loaded))


FLOOD = """
import json, sys
from tests.raw_http2 import reset_flood
flood = reset_flood(int(sys.argv[1]), int(sys.argv[2]))
end = flood.end
print(json.dumps({"sent": flood.sent, "closed": end is not None, "seconds": flood.seconds,
                  "goaway": None if end is None or end.goaway is None else int(end.goaway)}))
"""
"""`reset_flood` in a process of its own: in the test's, making its frames would take the
GIL from the normal client beside it, whose latencies are to measure the worker's."""


async def _flood(port: int, floods: list[dict[str, Any]]) -> None:
    done = await trio.run_process(
        [sys.executable, "-c", FLOOD, str(port), str(FLOOD_PAIRS)], cwd=REPO, capture_stdout=True
    )
    floods.append(json.loads(done.stdout))


async def run_tasks(client: WorkerClient, prefix: str, count: int) -> list[float]:
    """Run `count` tasks one at a time; the seconds each took, submit to result."""
    seconds = []
    for index in range(count):
        task = pb.TaskSpec(
            task_id=f"{prefix}-{index}",
            function_call=pb.FunctionCallConfig(type="call_list"),
            payload=b'[{"function": "demo.add", "args": [40, 2]}]',
            result_handler=pb.ResultHandler(type="result"),
        )
        started = time.perf_counter()
        result = await client.run_task(task)
        seconds.append(time.perf_counter() - started)
        assert result.state == pb.TaskState.SUCCEEDED, result
    return seconds


def p99(seconds: list[float]) -> float:
    ordered = sorted(seconds)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


def cpu_seconds(pid: int) -> float:
    """User and system CPU the process has used so far (/proc/<pid>/stat)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _closed_counts(metrics_port: int) -> dict[str, float]:
    """blockx_grpc_connections_closed_total by reason, as the worker's metrics show it."""
    url = f"http://127.0.0.1:{metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    counts = {}
    for line in text.splitlines():
        if line.startswith("blockx_grpc_connections_closed_total{"):
            labels, value = line.rsplit(" ", 1)
            counts[labels.split('reason="')[1].split('"')[0]] = float(value)
    return counts
