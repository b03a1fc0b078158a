"""A real worker process over gRPC: start time, memory, task latency and rate, RPC rate.

    uv run python bench/serve.py [--tasks 2000] [--in-flight 64] [--latency-tasks 500]
                                 [--executors 2]

One run starts `python -m blockx serve` (128 slots, examples/functions) and
measures, from a plain-asyncio grpclib client in this process:

* ready_s: spawning the process -> its "worker ready on" log line.
* first_result_s: spawning the process -> the terminal update of a one-call
  task submitted as soon as the worker logged that it is ready.
* idle_rss_mb: worker + executor RSS after ~1 s idle, in MiB (2**20 bytes).
* latency_p50_ms / latency_p99_ms: one-call tasks (`demo.add`) one after
  another, each timed from just before SubmitTask to the terminal WatchTasks
  update (after warm-up tasks).
* unary_tasks_per_s: one-call tasks with `--in-flight` concurrent submit+watch
  loops (SubmitTask + WatchTasks each), first submit -> last terminal update;
  worker_cpu_ms_per_task_unary: the worker process's CPU (from /proc) over
  that phase, divided by its tasks.
* stream_tasks_per_s: as many one-call tasks over RunTasks, one stream per
  client connection, each writing its share at once in requests of 64 tasks
  (`STREAM_BATCH`, as `blockx.client` batches them; the worker's back-pressure
  paces it) and reading to the end, first write -> last
  terminal update; worker_cpu_ms_per_task_stream: the worker's CPU over that
  phase, divided by its tasks.
* worker_cpu_ms_per_task_stream_result: the stream phase again (as many tasks),
  each task's outputs kept in its result (`result` plugin), the worker's CPU
  divided by its tasks; stream_result_to_echo_cpu_ratio: it over
  echo_cpu_ms_per_rpc.
* retained_bytes_after: right after the stream phase, the size of the results
  the worker retains (GetWorkerStatus' retained_bytes, bounded by
  resultRetentionBytes), with retained_results_after, their count.
* rpc_per_s / echo_rpc_per_s / rpc_ratio: GetTaskResult of a finished task
  from many concurrent callers, against the worker and against a bare grpclib
  echo server (plain asyncio, its own process) that answers with the very
  reply the worker gave, encoded once as the worker keeps a retained result's
  reply; the same load, in alternating rounds of one run (medians).
  echo_cpu_ms_per_rpc: the echo process's CPU over its rounds divided by the
  RPCs it answered; echo_latency_p50_ms: its median over 500 RPCs made one
  after another.

* w2_e2e_calls_per_s: one task of 20,000 `demo.add` calls (call_list payload,
  jsonl writer) through gRPC, submit -> terminal update, median of 3;
  engine_calls_per_s: bench/calls.py's engine rate for as many calls, run
  beside it in this run; w2_to_engine_ratio: the first over the second.
  ppe_map_calls_per_s: `concurrent.futures.ProcessPoolExecutor` with as many
  processes as the worker has executors, `map(chunksize=64)` of the same
  `demo.add` over 20,000 argument pairs, median of 3 after a warm-up map;
  w2_to_ppe_ratio: w2_e2e_calls_per_s over it.
* w3_efficiency: 200 one-call tasks of 10 ms of CPU each (`demo.burn`) over
  RunTasks (as stream_tasks_per_s runs them): the ideal time (the work spread
  evenly over the executors) divided by the time taken; w3_efficiency_unary:
  the same by `--in-flight` SubmitTask + WatchTasks loops.
* mixed_makespan_ratio (with 2 executors): one task of two 1 s calls and 40
  tasks of one 50 ms call, submitted together; first submit -> last terminal
  update, divided by the ideal 2.0 s.

`--phases` picks the phases to run (default all): latency and the task
rates need `tasks`, their ratios to the echo also `rpc`.

Targets (issue 12; the stream's CPU since tightened for batched requests), all
against figures of the same run: worker_cpu_ms_per_task_stream <= 0.6 x
echo_cpu_ms_per_rpc; worker_cpu_ms_per_task_stream_result <= 0.7 x
echo_cpu_ms_per_rpc; stream_tasks_per_s >= echo_rpc_per_s;
worker_cpu_ms_per_task_unary <= 3 x echo_cpu_ms_per_rpc; unary_tasks_per_s >=
0.35 x echo_rpc_per_s; latency_p50_ms <= 2.5 x echo_latency_p50_ms (issue 31 asks
2.0 x; docs/runtime.md says where the time goes); ready_s <=
1.0; first_result_s <= 1.2; idle_rss_mb <= 150; rpc_ratio >= 0.8;
mixed_makespan_ratio <= 1.15; w3_efficiency >= 0.85; w2_to_engine_ratio >= 0.6;
w2_to_ppe_ratio >= 0.4 (issue 31).
Prints each figure as `RESULT name=<figure> value=<number>`; never asserts.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import importlib
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar, cast

from grpclib.client import Channel
from grpclib.const import Cardinality
from grpclib.server import Server

from blockx._proto.blockx.worker import v1 as pb
from blockx.api._convert import Encoded
from blockx.api._server import SizeLimitedCodec
from blockx.process.lifecycle import tune_gc

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples" / "functions"
HOST = "127.0.0.1"
READY_LINE = "worker ready on"
RUN_TASKS_ROUTE = "/blockx.worker.v1.WorkerService/RunTasks"
WORKER_ENV = {
    **os.environ,
    "METRICS_LISTEN": "none",  # the bench measures the gRPC path alone
    "ETCD_ENDPOINTS": "none",  # no registration attempts (and no warnings) without an etcd
}
ECHO_READY_LINE = "echo ready"
MAX_MESSAGE_BYTES = 16 * 2**20  # the worker's default grpcMaxMessageBytes
SLOTS = 128
WARMUP_TASKS = 50
STREAM_BATCH = 64
"""Tasks per RunTasks request: the worker's window, the batch `blockx.client` sends."""
START_TIMEOUT_S = 60
PHASE_TIMEOUT_S = 120
STOP_TIMEOUT_S = 30
IDLE_S = 1.0
RPC_WARMUP_S = 0.5
MIB = 2**20
T = TypeVar("T")
# Lines of the worker's log that the bench repeats on stderr at the end.
NOTEWORTHY = re.compile(r"WARNING|ERROR|CRITICAL|Traceback|Exception")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        return int(probe.getsockname()[1])


def worker_command(port: int, executors: int, slots: int = SLOTS) -> list[str]:
    return [
        *(sys.executable, "-m", "blockx", "serve", "--listen", f"{HOST}:{port}"),
        *("--executors", str(executors), "--slots", str(slots), "--functions", str(EXAMPLES)),
    ]


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024 / MIB  # the kernel reports kB (KiB)
    raise SystemExit(f"no VmRSS for pid {pid}")


def cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of a process so far; None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()  # the name may hold spaces
    except FileNotFoundError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class CpuUse:
    """How busy each group of processes was over one or more blocks: who saturates a phase.

    Use `with meter:` around each block, then `report()`. A process that is
    gone by the end of a block (an executor replaced mid-phase) is left out of
    its group's figure, which is then marked.
    """

    def __init__(self, phase: str, groups: dict[str, list[int]]) -> None:
        self.phase = phase
        self.groups = groups
        self._elapsed_s = 0.0
        self._used_s = dict.fromkeys(groups, 0.0)
        self._gone: set[int] = set()
        self._started = 0.0
        self._cpu: dict[int, float | None] = {}

    def _read(self) -> dict[int, float | None]:
        return {pid: cpu_s(pid) for pids in self.groups.values() for pid in pids}

    def __enter__(self) -> None:
        self._started = time.perf_counter()
        self._cpu = self._read()

    def __exit__(self, *exc_info: object) -> None:
        self._elapsed_s += time.perf_counter() - self._started
        now = self._read()
        for name, pids in self.groups.items():
            for pid in pids:
                before, after = self._cpu[pid], now[pid]
                if before is None or after is None:
                    self._gone.add(pid)
                else:
                    self._used_s[name] += after - before

    def used_s(self, group: str) -> float:
        """CPU seconds the processes of `group` used over the blocks so far."""
        return self._used_s[group]

    def report(self) -> None:
        shares = []
        for name, pids in self.groups.items():
            gone = "".join(f" (pid {pid} gone)" for pid in pids if pid in self._gone)
            shares.append(f"{name} {100 * self._used_s[name] / self._elapsed_s:.0f} %{gone}")
        print(f"detail: {self.phase}: CPU use (of one core) {', '.join(shares)}", flush=True)


def call_list_task(task_id: str, *calls: tuple[str, list[object]]) -> pb.TaskSpec:
    entries = [{"function": function, "args": args} for function, args in calls]
    return pb.TaskSpec(
        task_id=task_id,
        function_call=pb.FunctionCallConfig(type="call_list"),
        payload=json.dumps({"calls": entries}).encode(),
    )


def one_call_task(task_id: str) -> pb.TaskSpec:
    return call_list_task(task_id, ("demo.add", [1, 2]))


def one_call_result_task(task_id: str) -> pb.TaskSpec:
    """`one_call_task` whose output is kept in its result (the `result` plugin)."""
    task = one_call_task(task_id)
    task.result_handler = pb.ResultHandler(type="result")
    return task


def percentile(samples: list[float], p: int) -> float:
    return statistics.quantiles(samples, n=100, method="inclusive")[p - 1]


def result(name: str, value: float, digits: int) -> None:
    print(f"RESULT name={name} value={value:.{digits}f}", flush=True)


# ------------------------------------------------------------------ the worker


class WorkerProcess:
    """The worker child: its stderr is read into `log` for its whole life, by a thread of
    its own. The bench's event loop is busy driving the load; a pipe it read late would
    fill and block the worker's log writes, throttling what is measured."""

    def __init__(self, process: asyncio.subprocess.Process, port: int, stderr_fd: int) -> None:
        self.process = process
        self.port = port
        self.log: list[str] = []
        self.ready = asyncio.Event()
        self.ready_at = 0.0
        loop = asyncio.get_running_loop()
        self._reader = threading.Thread(
            target=self._read_stderr, args=(stderr_fd, loop), name="worker-stderr", daemon=True
        )
        self._reader.start()

    def _read_stderr(self, fd: int, loop: asyncio.AbstractEventLoop) -> None:
        with open(fd, "rb") as stderr:
            for raw in stderr:  # to end of file: the worker's end closes when it exits
                line = raw.decode(errors="replace").rstrip("\n")
                self.log.append(line)
                if not self.ready_at and READY_LINE in line:
                    self.ready_at = time.perf_counter()
                    loop.call_soon_threadsafe(self.ready.set)

    async def stop(self) -> int:
        """SIGTERM, then wait (kill after STOP_TIMEOUT_S); returns the exit status."""
        if self.process.returncode is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            async with asyncio.timeout(STOP_TIMEOUT_S):
                code = await self.process.wait()
        except TimeoutError:
            print(f"worker still running {STOP_TIMEOUT_S} s after SIGTERM: killed", file=sys.stderr)
            self.process.kill()
            code = await self.process.wait()
        await asyncio.to_thread(self._reader.join)
        return code

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log[-lines:])


async def start_worker(
    executors: int, *, slots: int = SLOTS, env: dict[str, str] | None = None
) -> tuple[WorkerProcess, float, float]:
    """Start the worker (`env` added to WORKER_ENV); returns it, the seconds from spawn to
    its ready line, and the moment (perf_counter) it was spawned."""
    port = free_port()
    command = worker_command(port, executors, slots)
    spawned = time.perf_counter()
    stderr_fd, worker_stderr = os.pipe()
    try:
        process = await asyncio.create_subprocess_exec(
            *command,
            stderr=worker_stderr,
            stdout=subprocess.DEVNULL,
            cwd=REPO,
            env={**WORKER_ENV, **(env or {})},
        )
    except BaseException:
        os.close(stderr_fd)
        raise
    finally:
        os.close(worker_stderr)  # the worker holds its end: end of file when it exits
    worker = WorkerProcess(process, port, stderr_fd)
    exited = asyncio.create_task(process.wait())
    ready = asyncio.create_task(worker.ready.wait())
    first = asyncio.FIRST_COMPLETED
    await asyncio.wait({exited, ready}, timeout=START_TIMEOUT_S, return_when=first)
    exited.cancel()
    ready.cancel()
    if not worker.ready.is_set():
        code = await worker.stop()
        raise SystemExit(f"worker did not get ready (exit status {code}):\n{worker.tail()}")
    return worker, worker.ready_at - spawned, spawned


# ------------------------------------------------------------------ tasks


class TaskTimes:
    """Per-task seconds: submit RPC, submit -> terminal update, and the worker's own total."""

    def __init__(self) -> None:
        self.submit_s: list[float] = []
        self.end_to_end_s: list[float] = []
        self.worker_total_ms: list[int] = []

    def describe(self) -> str:
        """Where the median task's time goes: a hint, not a figure."""
        watch_s = [
            end - submit for submit, end in zip(self.submit_s, self.end_to_end_s, strict=True)
        ]
        worker_ms = statistics.median(self.worker_total_ms) if self.worker_total_ms else "n/a"
        return (
            f"detail: p50 of SubmitTask {statistics.median(self.submit_s) * 1000:.3f} ms, "
            f"of submit returned -> terminal update {statistics.median(watch_s) * 1000:.3f} ms, "
            f"of the worker's timings.total_ms {worker_ms} ms"
        )


async def run_task(stub: pb.WorkerServiceStub, task: pb.TaskSpec, times: TaskTimes) -> float:
    """Submit `task` and watch it to the end; returns the time of its terminal update."""
    task_id = task.task_id
    started = time.perf_counter()
    await stub.submit_task(pb.SubmitTaskRequest(task=task))
    submitted = time.perf_counter()
    terminal: pb.TaskUpdate | None = None
    ended = 0.0
    async for update in stub.watch_tasks(pb.WatchTasksRequest(task_ids=[task_id])):
        if update.is_terminal and terminal is None:
            ended = time.perf_counter()
            terminal = update
    if terminal is None:
        raise SystemExit(f"the watch of {task_id} ended without a terminal update")
    if terminal.state != pb.TaskState.SUCCEEDED:
        raise SystemExit(f"task {task_id} ended {terminal.state.name}: {terminal.result}")
    times.submit_s.append(submitted - started)
    times.end_to_end_s.append(ended - started)
    if terminal.result is not None and terminal.result.timings is not None:
        times.worker_total_ms.append(terminal.result.timings.total_ms)
    return ended


async def sequential_latency(stub: pb.WorkerServiceStub, count: int) -> TaskTimes:
    warm = TaskTimes()
    for i in range(WARMUP_TASKS):
        await run_task(stub, one_call_task(f"warm-{i}"), warm)
    times = TaskTimes()
    for i in range(count):
        await run_task(stub, one_call_task(f"latency-{i}"), times)
    return times


async def run_concurrently(
    channels: list[Channel], count: int, in_flight: int, make_task: Callable[[int], pb.TaskSpec]
) -> float:
    """Seconds from the first submit to the last terminal update of tasks `make_task(0)`
    .. `make_task(count - 1)`, run by `in_flight` submit+watch loops over `channels`."""
    stubs = [pb.WorkerServiceStub(channel) for channel in channels]
    indices = iter(range(count))  # shared by the loops: each takes the next task
    times = TaskTimes()

    async def loop(stub: pb.WorkerServiceStub) -> float:
        last = 0.0
        for index in indices:
            last = max(last, await run_task(stub, make_task(index), times))
        return last

    started = time.perf_counter()
    ends = await asyncio.gather(*(loop(stubs[n % len(stubs)]) for n in range(in_flight)))
    return max(ends) - started


async def run_streamed(
    channels: list[Channel], count: int, make_task: Callable[[int], pb.TaskSpec]
) -> float:
    """Seconds from the first write to the last terminal update of tasks `make_task(0)`
    .. `make_task(count - 1)` over RunTasks, one stream per channel, each writing its
    share at once in requests of `STREAM_BATCH` tasks (the worker's back-pressure paces
    it) and reading to its end."""

    async def one_stream(channel: Channel, first: int) -> None:
        async with channel.request(
            RUN_TASKS_ROUTE, Cardinality.STREAM_STREAM, pb.RunTasksRequest, pb.RunTasksResponse
        ) as stream:
            await stream.send_request()

            async def write() -> None:
                share = range(first, count, len(channels))
                for start in range(0, len(share), STREAM_BATCH):
                    items = [
                        pb.RunTasksItem(task=make_task(index))
                        for index in share[start : start + STREAM_BATCH]
                    ]
                    await stream.send_message(pb.RunTasksRequest(items=items))
                await stream.end()

            writer = asyncio.create_task(write())
            async for response in stream:
                for event in response.events:
                    update = event.finished
                    if event.refused is not None:
                        raise SystemExit(f"a streamed task was refused: {event.refused}")
                    if update is not None and update.state != pb.TaskState.SUCCEEDED:
                        raise SystemExit(f"task {update.task_id} ended {update.state.name}")
            await writer

    started = time.perf_counter()
    await asyncio.gather(*(one_stream(channel, n) for n, channel in enumerate(channels)))
    return time.perf_counter() - started


async def stream_tasks_per_s(
    channels: list[Channel], count: int, make_task: Callable[[int], pb.TaskSpec] | None = None
) -> float:
    elapsed = await run_streamed(
        channels, count, make_task or (lambda index: one_call_task(f"stream-{index}"))
    )
    return count / elapsed


async def tasks_per_s(channels: list[Channel], count: int, in_flight: int) -> float:
    elapsed = await run_concurrently(
        channels, count, in_flight, lambda index: one_call_task(f"rate-{index}")
    )
    return count / elapsed


# ------------------------------------------------------------------ unary RPC


class RpcLoad:
    """GetTaskResult calls from `callers` concurrent loops over `channels` connections."""

    def __init__(self, port: int, task_id: str, callers: int, channels: int) -> None:
        self.callers = callers
        self._channels = [Channel(HOST, port) for _ in range(channels)]
        self._stubs = [pb.WorkerServiceStub(channel) for channel in self._channels]
        self._request = pb.GetTaskResultRequest(task_id=task_id)
        self.calls = 0
        """Calls answered in measured rounds (`rate`), warm-up excluded."""

    async def latency_p50_ms(self, count: int) -> float:
        """Median time of `count` calls made one after another."""
        stub = self._stubs[0]
        times = []
        for _ in range(count):
            started = time.perf_counter()
            await stub.get_task_result(self._request)
            times.append(time.perf_counter() - started)
        return statistics.median(times) * 1000

    async def _loop(self, stub: pb.WorkerServiceStub, until: float) -> int:
        calls = 0
        while time.perf_counter() < until:
            await stub.get_task_result(self._request)
            calls += 1
        return calls

    async def rate(self, seconds: float) -> float:
        """Calls per second over about `seconds`."""
        started = time.perf_counter()
        until = started + seconds
        stubs = self._stubs
        loops = (self._loop(stubs[n % len(stubs)], until) for n in range(self.callers))
        calls = sum(await asyncio.gather(*loops))
        self.calls += calls
        return calls / (time.perf_counter() - started)

    def close(self) -> None:
        for channel in self._channels:
            channel.close()


async def compare_rpc(
    loads: dict[str, RpcLoad], meters: dict[str, CpuUse], seconds: float, rounds: int
) -> dict[str, float]:
    """Median rate of each load over `rounds` alternating rounds of `seconds / rounds`.

    Alternating spreads any outside load on the (shared, small) machine over
    both servers instead of letting it land on one.
    """
    for load in loads.values():
        await load.rate(RPC_WARMUP_S)  # connections open, code paths warm
        load.calls = 0
    rates: dict[str, list[float]] = {name: [] for name in loads}
    for _ in range(rounds):
        for name, load in loads.items():
            with meters[name]:
                rates[name].append(await load.rate(seconds / rounds))
    return {name: statistics.median(values) for name, values in rates.items()}


class EchoService(pb.WorkerServiceBase):
    """Answers GetTaskResult with one fixed reply: the floor for a grpclib unary RPC.

    The reply's bytes are made once, as the worker does for a retained result,
    so neither side of the comparison spends time encoding it.
    """

    def __init__(self, reply: pb.GetTaskResultResponse) -> None:
        self.reply = cast(pb.GetTaskResultResponse, Encoded(bytes(reply)))

    async def get_task_result(self, message: pb.GetTaskResultRequest) -> pb.GetTaskResultResponse:
        return self.reply


async def echo_server(port: int, reply_hex: str) -> None:
    reply = pb.GetTaskResultResponse.parse(bytes.fromhex(reply_hex))
    server = Server([EchoService(reply)], codec=SizeLimitedCodec(MAX_MESSAGE_BYTES))
    await server.start(HOST, port)
    print(ECHO_READY_LINE, flush=True)
    await server.wait_closed()


async def start_echo_server(
    reply: pb.GetTaskResultResponse,
) -> tuple[asyncio.subprocess.Process, int]:
    port = free_port()
    process = await asyncio.create_subprocess_exec(
        *(sys.executable, __file__, "--echo-server", str(port), bytes(reply).hex()),
        stdout=subprocess.PIPE,
    )
    assert process.stdout is not None
    async with asyncio.timeout(START_TIMEOUT_S):
        line = await process.stdout.readline()
    if ECHO_READY_LINE not in line.decode():
        raise SystemExit(f"the echo server did not start (exit status {await process.wait()})")
    return process, port


# ------------------------------------------------------------------ the run


async def phase(name: str, work: Callable[[], Awaitable[T]]) -> T:
    try:
        async with asyncio.timeout(PHASE_TIMEOUT_S):
            return await work()
    except TimeoutError:
        raise SystemExit(f"{name} did not finish within {PHASE_TIMEOUT_S} s") from None


async def measure_idle_rss(worker: WorkerProcess, stub: pb.WorkerServiceStub) -> list[int]:
    """Prints idle_rss_mb; returns the executors' pids."""
    await asyncio.sleep(IDLE_S)
    status = await stub.get_worker_status(pb.GetWorkerStatusRequest())
    pids = [executor.pid for executor in status.executors]
    rss = rss_mib(worker.process.pid) + sum(rss_mib(pid) for pid in pids)
    result("idle_rss_mb", rss, 1)
    print(f"detail: {len(pids)} executors, pids {pids}", flush=True)
    return pids


async def measure_tasks(
    args: argparse.Namespace, channels: list[Channel], serving: dict[str, list[int]]
) -> float:
    """The latency, unary and stream phases; the stream phase's worker CPU per task (ms)
    with the `result` plugin."""
    stub = pb.WorkerServiceStub(channels[0])
    latency_cpu = CpuUse("latency", serving)
    with latency_cpu:
        times = await phase("latency", lambda: sequential_latency(stub, args.latency_tasks))
    latency_cpu.report()
    result("latency_p50_ms", statistics.median(times.end_to_end_s) * 1000, 3)
    result("latency_p99_ms", percentile(times.end_to_end_s, 99) * 1000, 3)
    print(times.describe(), flush=True)

    tasks_cpu = CpuUse("tasks", serving)
    with tasks_cpu:
        rate = await phase("tasks", lambda: tasks_per_s(channels, args.tasks, args.in_flight))
    tasks_cpu.report()
    result("unary_tasks_per_s", rate, 0)
    worker_ms = tasks_cpu.used_s("worker") * 1000 / args.tasks
    result("worker_cpu_ms_per_task_unary", worker_ms, 3)

    # The stream's own warm-up, as the latency phase has one for the unary path: the
    # figure is the steady cost of a streamed task, not its first use.
    await run_streamed(channels, WARMUP_TASKS, lambda index: one_call_task(f"warm-s{index}"))
    stream_cpu = CpuUse("stream", serving)
    with stream_cpu:
        rate = await phase("stream", lambda: stream_tasks_per_s(channels, args.tasks))
    stream_cpu.report()
    result("stream_tasks_per_s", rate, 0)
    worker_ms = stream_cpu.used_s("worker") * 1000 / args.tasks
    result("worker_cpu_ms_per_task_stream", worker_ms, 3)
    status = await stub.get_worker_status(pb.GetWorkerStatusRequest())
    result("retained_bytes_after", status.retained_bytes, 0)
    result("retained_results_after", status.retained_results, 0)
    return await measure_stream_result(args, channels, serving)


async def measure_stream_result(
    args: argparse.Namespace, channels: list[Channel], serving: dict[str, list[int]]
) -> float:
    """The stream phase again, each task keeping its outputs (`result` plugin); the worker's
    CPU per task, in ms."""
    await run_streamed(channels, WARMUP_TASKS, lambda index: one_call_result_task(f"warm-r{index}"))
    result_cpu = CpuUse("stream result", serving)
    with result_cpu:
        await phase(
            "stream result",
            lambda: stream_tasks_per_s(
                channels, args.tasks, lambda index: one_call_result_task(f"result-{index}")
            ),
        )
    result_cpu.report()
    worker_ms = result_cpu.used_s("worker") * 1000 / args.tasks
    result("worker_cpu_ms_per_task_stream_result", worker_ms, 3)
    return worker_ms


W2_CALLS = 20_000
W2_RUNS = 3


async def w2_calls_per_s(stub: pb.WorkerServiceStub, out_dir: str) -> float:
    """One task of `W2_CALLS` `demo.add` calls (call_list payload, jsonl writer) through
    gRPC, submit -> terminal update; the median rate of `W2_RUNS` runs."""
    calls = [{"function": "demo.add", "args": [index, 1]} for index in range(W2_CALLS)]
    payload = json.dumps({"calls": calls}).encode()
    rates = []
    for run in range(W2_RUNS):
        task = pb.TaskSpec(
            task_id=f"w2-{run}",
            function_call=pb.FunctionCallConfig(type="call_list"),
            payload=payload,
            result_handler=pb.ResultHandler(
                type="jsonl", config_json=json.dumps({"path": f"{out_dir}/w2-{run}.jsonl"})
            ),
        )
        started = time.perf_counter()
        ended = await run_task(stub, task, TaskTimes())
        rates.append(W2_CALLS / (ended - started))
    return statistics.median(rates)


async def engine_calls_per_s() -> float:
    """bench/calls.py's engine rate (its own process), for the same number of calls."""
    process = await asyncio.create_subprocess_exec(
        *(sys.executable, str(REPO / "bench" / "calls.py"), "--calls", str(W2_CALLS)),
        *("--repeats", "3"),
        stdout=subprocess.PIPE,
    )
    output, _ = await process.communicate()
    found = re.search(rb"RESULT name=calls_per_s value=([0-9.]+)", output)
    if process.returncode != 0 or found is None:
        raise SystemExit(f"bench/calls.py failed (exit status {process.returncode})")
    return float(found[1])


def ppe_map_calls_per_s(processes: int) -> float:
    """A process pool's chunked map of the same addition as w2, median of `W2_RUNS`."""
    sys.path.insert(0, str(EXAMPLES))
    add = importlib.import_module("demo").add  # w2's function, examples/functions/demo.py
    firsts, seconds = range(W2_CALLS), [1] * W2_CALLS
    rates = []
    with concurrent.futures.ProcessPoolExecutor(processes) as pool:
        list(pool.map(add, range(1000), [1] * 1000, chunksize=64))  # warm-up
        for _ in range(W2_RUNS):
            started = time.perf_counter()
            sums = list(pool.map(add, firsts, seconds, chunksize=64))
            rates.append(W2_CALLS / (time.perf_counter() - started))
            if sums[-1] != W2_CALLS:
                raise SystemExit("the process pool's map returned a wrong sum")
    return statistics.median(rates)


W3_TASKS = 200
W3_CALL_MS = 10.0


def w3_task(index: int) -> pb.TaskSpec:
    return call_list_task(f"w3-{index}", ("demo.burn", [W3_CALL_MS]))


async def w3_efficiency(channels: list[Channel], executors: int) -> float:
    """`W3_TASKS` one-call tasks of `W3_CALL_MS` of CPU each (`demo.burn`) over RunTasks:
    the ideal time (all the work spread evenly over the executors) over the time taken,
    first write -> last terminal update."""
    elapsed = await run_streamed(channels, W3_TASKS, w3_task)
    return W3_TASKS * W3_CALL_MS / 1000 / executors / elapsed


async def w3_efficiency_unary(channels: list[Channel], executors: int, in_flight: int) -> float:
    """The same tasks by `in_flight` SubmitTask + WatchTasks loops."""
    elapsed = await run_concurrently(
        channels, W3_TASKS, in_flight, lambda index: w3_task(W3_TASKS + index)
    )
    return W3_TASKS * W3_CALL_MS / 1000 / executors / elapsed


MIXED_IDEAL_S = 2.0
"""Two 1 s calls and forty 50 ms calls on 2 executors: 4 s of work, 2 s each at best."""


async def mixed_makespan_ratio(stub: pb.WorkerServiceStub) -> float:
    """One task of two 1 s calls and 40 tasks of one 50 ms call, submitted together:
    first submit -> last terminal update, over the ideal."""
    tasks = [call_list_task("mixed-long", ("demo.sleep", [1.0]), ("demo.sleep", [1.0]))]
    tasks += [call_list_task(f"mixed-{index}", ("demo.sleep", [0.05])) for index in range(40)]
    times = TaskTimes()
    started = time.perf_counter()
    ends = await asyncio.gather(*(run_task(stub, task, times) for task in tasks))
    return (max(ends) - started) / MIXED_IDEAL_S


async def measure_rpc(
    args: argparse.Namespace, worker: WorkerProcess, serving: dict[str, list[int]]
) -> float:
    """The RPC phases; echo_cpu_ms_per_rpc."""
    finished = "latency-0"  # a task of the latency phase: its result is retained
    probe = Channel(HOST, worker.port)
    try:
        request = pb.GetTaskResultRequest(task_id=finished)
        reply = await pb.WorkerServiceStub(probe).get_task_result(request)
    finally:
        probe.close()
    echo, echo_port = await start_echo_server(reply)
    load = (finished, args.rpc_callers, args.channels)
    loads = {"worker": RpcLoad(worker.port, *load), "echo": RpcLoad(echo_port, *load)}
    meters = {
        "worker": CpuUse("rpc", serving),
        "echo": CpuUse("echo rpc", {"bench": serving["bench"], "echo": [echo.pid]}),
    }
    try:
        rpc = await phase(
            "rpc", lambda: compare_rpc(loads, meters, args.rpc_seconds, args.rpc_rounds)
        )
        echo_calls = loads["echo"].calls
        echo_p50_ms = await phase("echo latency", lambda: loads["echo"].latency_p50_ms(500))
    finally:
        for rpc_load in loads.values():
            rpc_load.close()
        echo.terminate()
        await echo.wait()
    for meter in meters.values():
        meter.report()
    result("rpc_per_s", rpc["worker"], 0)
    result("echo_rpc_per_s", rpc["echo"], 0)
    result("rpc_ratio", rpc["worker"] / rpc["echo"], 3)
    result("echo_latency_p50_ms", echo_p50_ms, 3)
    echo_cpu_ms = meters["echo"].used_s("echo") * 1000 / echo_calls
    result("echo_cpu_ms_per_rpc", echo_cpu_ms, 3)
    return echo_cpu_ms


async def stop_worker(worker: WorkerProcess, log_path: str | None) -> int:
    """SIGTERM and wait; say what went wrong in its log and its exit status, and return it."""
    code = await worker.stop()
    if log_path is not None:
        Path(log_path).write_text("\n".join(worker.log) + "\n")
    noteworthy = [line for line in worker.log if NOTEWORTHY.search(line)]
    if noteworthy:
        print(f"worker log: {len(noteworthy)} noteworthy lines, first 20:", file=sys.stderr)
        print("\n".join(noteworthy[:20]), file=sys.stderr)
    if code != 0:
        print(f"worker exited with status {code}; its log ends:", file=sys.stderr)
        print(worker.tail(), file=sys.stderr)
    return code


async def bench(args: argparse.Namespace) -> None:
    phases = set(args.phases.split(","))
    if unknown := phases - PHASES:
        raise SystemExit(f"unknown phases {sorted(unknown)}; known: {sorted(PHASES)}")
    worker, ready_s, spawned = await start_worker(args.executors)
    channels = [Channel(HOST, worker.port) for _ in range(args.channels)]
    stub = pb.WorkerServiceStub(channels[0])
    try:
        first_ended = await run_task(stub, one_call_task("first"), TaskTimes())
        result("ready_s", ready_s, 3)
        result("first_result_s", first_ended - spawned, 3)
        pids = await measure_idle_rss(worker, stub)
        serving = {"bench": [os.getpid()], "worker": [worker.process.pid], "executors": pids}
        if "tasks" in phases:
            stream_result_ms = await measure_tasks(args, channels, serving)
        if "w2" in phases:
            await measure_calls(stub, args.executors)
        if "w3" in phases:
            await measure_w3(args, channels, stub)
        if "rpc" in phases:
            echo_cpu_ms = await measure_rpc(args, worker, serving)
            if "tasks" in phases:
                ratio = stream_result_ms / echo_cpu_ms
                result("stream_result_to_echo_cpu_ratio", ratio, 3)
    finally:
        for channel in channels:
            channel.close()
        await stop_worker(worker, args.worker_log)


async def measure_calls(stub: pb.WorkerServiceStub, executors: int) -> None:
    """w2 beside the engine alone and a process pool's chunked map."""
    with tempfile.TemporaryDirectory() as out_dir:
        w2 = await phase("w2", lambda: w2_calls_per_s(stub, out_dir))
    result("w2_e2e_calls_per_s", w2, 0)
    engine = await phase("engine", engine_calls_per_s)
    result("engine_calls_per_s", engine, 0)
    result("w2_to_engine_ratio", w2 / engine, 3)
    ppe = await phase("ppe", lambda: asyncio.to_thread(ppe_map_calls_per_s, executors))
    result("ppe_map_calls_per_s", ppe, 0)
    result("w2_to_ppe_ratio", w2 / ppe, 3)


async def measure_w3(
    args: argparse.Namespace, channels: list[Channel], stub: pb.WorkerServiceStub
) -> None:
    """Calls of 10 ms over the executors, by stream and by unary loops; the mixed makespan."""
    efficiency = await phase("w3", lambda: w3_efficiency(channels, args.executors))
    result("w3_efficiency", efficiency, 3)
    efficiency = await phase(
        "w3 unary", lambda: w3_efficiency_unary(channels, args.executors, args.in_flight)
    )
    result("w3_efficiency_unary", efficiency, 3)
    if args.executors == 2:  # the figure is defined on 2 executors
        ratio = await phase("mixed", lambda: mixed_makespan_ratio(stub))
        result("mixed_makespan_ratio", ratio, 3)


PHASES = frozenset({"tasks", "w2", "w3", "rpc"})


def main() -> None:
    tune_gc()  # as the worker process does
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=2000, help="tasks of the rate phase")
    parser.add_argument("--in-flight", type=int, default=64, help="concurrent task loops")
    parser.add_argument("--latency-tasks", type=int, default=500, help="sequential tasks timed")
    parser.add_argument("--executors", type=int, default=2)
    parser.add_argument("--rpc-callers", type=int, default=64, help="concurrent RPC loops")
    parser.add_argument("--rpc-seconds", type=float, default=3.0, help="RPC load per server")
    parser.add_argument("--rpc-rounds", type=int, default=3, help="alternating rounds; medians")
    parser.add_argument("--channels", type=int, default=4, help="client connections per server")
    parser.add_argument(
        "--phases", default=",".join(sorted(PHASES)), help="comma-separated: tasks,w2,w3,rpc"
    )
    parser.add_argument("--worker-log", metavar="PATH", help="write the worker's stderr here")
    parser.add_argument("--echo-server", nargs=2, metavar=("PORT", "REPLY"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.echo_server is not None:
        port, reply_hex = args.echo_server
        asyncio.run(echo_server(int(port), reply_hex))
        return
    asyncio.run(bench(args))


if __name__ == "__main__":
    main()
