"""Automatic workers end to end: tasks/s and submit-to-result latency, beside the bare submit.

    uv run python bench/autoworker.py [--tasks 5000] [--latency-tasks 200] [--clients 32]
                                      [--workers 2] [--capacity 8] [--hub-env NAME=VALUE ...]
                                      [--profile-hub FILE] [--dashboard] [--keep]

One run starts a `python -m blockx hub` process on a fresh SQLite file in a
temporary directory (the default store: WAL, synchronous=FULL) and WORKERS
processes of this script in `--worker` mode, each one automatic `Worker` of
capacity CAPACITY whose handler returns its payload. This process is the
producer, over HTTP: `HubClient(keep_alive=True)`, whose requests reuse the
connections the hub keeps open (HTTP/1.1 keep-alive), unless said. After a
warm-up of 200 tasks:

* hub_submits_per_s (baseline): TASKS submissions to a queue no worker serves,
  from CLIENTS concurrent clients, first request -> last answer: the rate the
  hub takes tasks at, with nothing else to do; hub_submits_fresh_per_s: as
  many with a new connection for each request (as `HubClient` makes them).
* auto_tasks_per_s: TASKS submissions from CLIENTS concurrent clients, first
  request -> the moment the queue's listing shows none of them QUEUED, OFFERED
  or RUNNING (polled every 10 ms once the last submission was answered); each of
  them must have SUCCEEDED. auto_to_submit_ratio: the first over the second.
  hub_cpu_ms_per_task, worker_cpu_ms_per_task: the CPU the hub process and the
  worker processes (together) used over that phase, per task (from /proc);
  producer_cpu_ms_per_task: this process's.
* submit_p50_ms (baseline): one submission at a time, request -> answer.
* sqlite_commit_p50_ms (baseline): one row committed per transaction, one after
  another, to a SQLite file beside the hub's with its settings (WAL,
  synchronous=FULL): what one durable step costs on this disk now. A task's
  way takes at least three (submitted, started, finished).
* auto_latency_p50_ms, auto_latency_p99_ms: LATENCY_TASKS tasks one at a time,
  each timed from just before its submission to the answer of
  `GET /v1/tasks/{id}?wait_ms=10000` that shows it SUCCEEDED (a hub that does
  not know `wait_ms` answers at once, and the reader asks again);
  auto_latency_to_commit_ratio: its p50 over sqlite_commit_p50_ms.
  auto_latency_polled_p50_ms: as many more, read by plain GETs back to back.

With `--dashboard`, then: the cost of an open dashboard. The producers run
TASKS tasks through the workers DASHBOARD_ROUNDS times without and as many
times with the hub's dashboard open, alternately (off, on, off, on...):
dashboard_off_tasks_per_s and dashboard_on_tasks_per_s are the medians of
their rounds' auto_tasks_per_s, dashboard_throughput_ratio the second over the
first (target >= 0.95). "Open" is what the overview page does in a browser,
as the hub sees it: one admin signed in (`POST /ui/sign-in`), the page and
the hour's series read (`GET /ui/overview`, `GET /v1/stats`), and its live
stream followed (`GET /v1/events`, a tick a second, each read to its end);
dashboard_ticks counts the ticks read, which must be at least one per
second of the open rounds. (A real Chromium on this 2-core machine would
also take CPU from the hub to draw: that is the browser's cost, not the
hub's.)

At the end the hub's `/metrics` is scraped: its submissions, successful
finishes and task counts of the queue must agree with the database
(`metrics_agree` is 1), or the run fails.

Prints each figure as `RESULT name=<figure> value=<number>`; asserts nothing
timed.
Targets (2 cores): auto_tasks_per_s >= 1,000 and auto_latency_p50_ms <= 10.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, Final, TypeVar

import h11
import trio
from prometheus_client.parser import text_string_to_metric_families

from blockx.autoworker import (
    Capability,
    HubClient,
    Worker,
    WorkerExecution,
    WorkerHandler,
    WorkerOptions,
)
from blockx.hub import ANY_QUEUE, Right, Store, TaskState, create_credential, create_queue

T = TypeVar("T")

QUEUE: Final = "bench"
IDLE_QUEUE: Final = "bench-idle"
"""Where the baseline's submissions go: no worker serves it, so they just queue."""
CAPABILITY: Final = Capability(handler="bench.echo", handler_version="1", payload_version="1")
WARM_UP_TASKS: Final = 200
LIVE: Final = (TaskState.QUEUED, TaskState.OFFERED, TaskState.RUNNING)
DONE_POLL_S: Final = 0.01
WAIT_MS: Final = 10_000
START_TIMEOUT_S: Final = 30.0
PHASE_TIMEOUT_S: Final = 600.0
DASHBOARD_ROUNDS: Final = 3
SESSION_COOKIE: Final = "blockx_hub_session"


def result(name: str, value: float, digits: int = 0) -> None:
    print(f"RESULT name={name} value={value:.{digits}f}", flush=True)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


# ------------------------------------------------------------------------ the worker


async def echo(execution: WorkerExecution) -> Any:
    return execution.payload


def echo_in_a_thread(execution: WorkerExecution) -> Any:
    return execution.payload


async def work(url: str, capacity: int, plain: bool) -> None:
    """`--worker` mode: one automatic worker until SIGTERM, then its drain; prints its counts."""
    client = HubClient(url=url, credential=os.environ["BENCH_HUB_CREDENTIAL"])
    handle = echo_in_a_thread if plain else echo
    options = WorkerOptions(
        queue_id=QUEUE,
        capacity=capacity,
        handlers=[WorkerHandler(capability=CAPABILITY, handle=handle)],
    )
    worker = Worker(client, options)
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(worker.run)
            print("worker running", flush=True)
            async for _ in signals:
                nursery.cancel_scope.cancel()
                break
    stats = worker.stats()
    print(
        f"worker started={stats.started} confirmed={stats.reports_confirmed} "
        f"reconnects={stats.reconnects} running={stats.running}",
        flush=True,
    )


# ------------------------------------------------------------------------ processes


async def open_logged(
    command: list[str], env: dict[str, str], ready: bytes, log: Path
) -> trio.Process:
    """Start `command` with its stdout and stderr in `log`; wait until `ready` is there."""
    with log.open("wb") as sink:
        process = await trio.lowlevel.open_process(
            command, stdin=subprocess.DEVNULL, stdout=sink, stderr=sink, env=env
        )
    with trio.move_on_after(START_TIMEOUT_S):
        while ready not in log.read_bytes():
            if process.poll() is not None:
                break
            await trio.sleep(0.02)
    if ready not in log.read_bytes():
        process.kill()
        raise SystemExit(f"{command[1:4]} did not start:\n{log.read_text(errors='replace')}")
    return process


async def open_hub(
    db: Path | str, directory: Path, *, env: dict[str, str] | None = None, name: str = "hub"
) -> tuple[str, trio.Process]:
    """A `python -m blockx hub` process on `db` at a free loopback port, its log in
    `directory`/`name`.log, the environment's HUB_ settings replaced by `env`: its URL and
    the process."""
    port = free_port()
    hub_env = {k: v for k, v in os.environ.items() if not k.startswith("HUB_")}
    hub_env.update(LOG_FORMAT="text", **(env or {}))
    command = [sys.executable, "-m", "blockx", "hub", "--db", str(db)]
    command += ["--listen", f"127.0.0.1:{port}"]
    hub = await open_logged(command, hub_env, b"listening on", directory / f"{name}.log")
    return f"http://127.0.0.1:{port}", hub


async def open_worker(
    url: str, token: str, capacity: int, log: Path, *, plain: bool = False
) -> trio.Process:
    """One automatic worker of this bench (`--worker`) on the hub at `url`."""
    command = [sys.executable, __file__, "--worker", url, "--capacity", str(capacity)]
    command += ["--plain"] if plain else []
    env = {**os.environ, "BENCH_HUB_CREDENTIAL": token}
    return await open_logged(command, env, b"worker running", log)


async def stop(process: trio.Process, timeout_s: float = 30.0) -> None:
    process.send_signal(signal.SIGTERM)
    with trio.move_on_after(timeout_s):
        await process.wait()
    if process.returncode is None:
        process.kill()
        await process.wait()


# ------------------------------------------------------------------------ producers


async def submit_all(
    client: HubClient, queue_id: str, capability: Capability, count: int, clients: int
) -> list[str]:
    """`count` submissions from `clients` concurrent clients; the task ids."""
    ids: list[str] = []
    numbers = iter(range(count))

    async def one_client() -> None:
        for n in numbers:
            task = await client.submit(queue_id, capability, {"n": n})
            ids.append(task["task_id"])

    async with trio.open_nursery() as nursery:
        for _ in range(clients):
            nursery.start_soon(one_client)
    return ids


async def live_tasks(client: HubClient, queue_id: str) -> bool:
    """Whether the queue's listing shows any task not ended yet."""
    for state in LIVE:
        listed = await client.request("GET", f"/v1/queues/{queue_id}/tasks?state={state}&limit=1")
        if listed["tasks"]:
            return True
    return False


async def through_workers(client: HubClient, count: int, clients: int) -> float:
    """Seconds from the first of `count` submissions to none of them left to run."""
    started = time.perf_counter()
    await submit_all(client, QUEUE, CAPABILITY, count, clients)
    while await live_tasks(client, QUEUE):
        await trio.sleep(DONE_POLL_S)
    return time.perf_counter() - started


async def submit_rate(client: HubClient, count: int, clients: int) -> float:
    """Submissions per second to the queue no worker serves."""
    started = time.perf_counter()
    await submit_all(client, IDLE_QUEUE, CAPABILITY, count, clients)
    return count / (time.perf_counter() - started)


async def submit_latencies(client: HubClient, count: int) -> list[float]:
    latencies = []
    for n in range(count):
        started = time.perf_counter()
        await client.submit(IDLE_QUEUE, CAPABILITY, {"n": n})
        latencies.append((time.perf_counter() - started) * 1000)
    return latencies


async def task_latencies(client: HubClient, count: int, wait_ms: int) -> list[float]:
    """Submission -> SUCCEEDED visible to the producer, one task at a time, in ms."""
    latencies = []
    for n in range(count):
        started = time.perf_counter()
        task = await client.submit(QUEUE, CAPABILITY, {"n": n})
        while task["state"] != TaskState.SUCCEEDED:
            if task["state"] in (TaskState.FAILED, TaskState.NEEDS_REVIEW):
                raise SystemExit(f"a task ended {task['state']}: {json.dumps(task)}")
            task = await client.request("GET", f"/v1/tasks/{task['task_id']}?wait_ms={wait_ms}")
        latencies.append((time.perf_counter() - started) * 1000)
    return latencies


def commit_latencies(path: Path, count: int) -> list[float]:
    """Milliseconds per one-row transaction, WAL and synchronous=FULL as the hub."""
    connection = sqlite3.connect(path, isolation_level=None)
    connection.execute("PRAGMA journal_mode = WAL")
    connection.execute("PRAGMA synchronous = FULL")
    connection.execute("CREATE TABLE rows (row_id INTEGER PRIMARY KEY, value TEXT NOT NULL)")
    latencies = []
    for _ in range(count):
        started = time.perf_counter()
        connection.execute("BEGIN IMMEDIATE")
        connection.execute("INSERT INTO rows (value) VALUES (?)", ('{"n":1}',))
        connection.execute("COMMIT")
        latencies.append((time.perf_counter() - started) * 1000)
    connection.close()
    return latencies


def cpu_seconds(pid: int) -> float:
    """User and system CPU time of process `pid` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def with_cpu(phase: Awaitable[T], pids: list[int]) -> tuple[T, list[float]]:
    """What `phase` returns, and the CPU seconds each of `pids`, then this process, used."""
    before = [cpu_seconds(pid) for pid in pids] + [time.process_time()]
    value = await phase
    after = [cpu_seconds(pid) for pid in pids] + [time.process_time()]
    return value, [b - a for a, b in zip(before, after, strict=True)]


@contextlib.contextmanager
def profiled(output: str | None, pid: int) -> Iterator[None]:
    """Samples process PID with py-spy (collapsed stacks to OUTPUT) while the block runs."""
    if output is None:
        yield
        return
    if shutil.which("py-spy") is None:
        raise SystemExit("--profile-hub needs py-spy on PATH (uv tool install py-spy)")
    command = ["py-spy", "record", "--pid", str(pid), "--format", "raw", "--output", output]
    with subprocess.Popen([*command, "--rate", "250"], stdout=subprocess.DEVNULL) as spy:
        time.sleep(0.5)  # py-spy attaches
        try:
            yield
        finally:
            spy.send_signal(signal.SIGINT)


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


# ------------------------------------------------------------------------ the dashboard


async def http(
    url: str, method: str, path: str, *, cookie: str = "", body: bytes = b""
) -> tuple[h11.Response, AsyncIterator[bytes]]:
    """Send one request to the hub at `url` on a connection of its own (HTTP/1.1 by h11);
    its answer's head, and its body as it comes (the connection closes at its end)."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    stream = await trio.open_tcp_stream(host, int(port))
    connection = h11.Connection(h11.CLIENT)
    headers = [("host", f"{host}:{port}"), ("content-length", str(len(body)))]
    headers += [("cookie", cookie)] if cookie else []
    headers += [("content-type", "application/x-www-form-urlencoded")] if body else []
    request = h11.Request(method=method, target=path, headers=headers)
    await stream.send_all(
        connection.send(request)
        + connection.send(h11.Data(data=body))
        + connection.send(h11.EndOfMessage())
    )
    events = _events(connection, stream)
    head = await anext(events)
    assert isinstance(head, h11.Response)
    return head, (event.data async for event in events if isinstance(event, h11.Data))


async def _events(connection: h11.Connection, stream: trio.SocketStream) -> AsyncIterator[Any]:
    """The h11 events of the answer on `stream`, until its end; then the stream is closed."""
    async with stream:
        while True:
            event = connection.next_event()
            if event is h11.NEED_DATA:
                connection.receive_data(await stream.receive_some())
            elif isinstance(event, (h11.EndOfMessage, h11.ConnectionClosed)):
                return
            else:
                yield event


async def read_all(url: str, path: str, cookie: str) -> bytes:
    """The body of `GET path`."""
    head, chunks = await http(url, "GET", path, cookie=cookie)
    body = b"".join([chunk async for chunk in chunks])
    if head.status_code != 200:
        raise SystemExit(f"GET {path}: {head.status_code} {body[:200]!r}")
    return body


async def sign_in(url: str, token: str) -> str:
    """Sign an admin in to the dashboard; the cookie to send."""
    form = urllib.parse.urlencode({"credential": token}).encode()
    head, chunks = await http(url, "POST", "/ui/sign-in", body=form)
    async for _ in chunks:  # read to its end: the connection closes
        pass
    headers = {name.decode(): value.decode() for name, value in head.headers}
    cookie = headers.get("set-cookie", "").split(";", 1)[0]
    if head.status_code != 303 or not cookie.startswith(f"{SESSION_COOKIE}="):
        raise SystemExit(f"signing in to the dashboard: {head.status_code} {headers}")
    return cookie


async def open_dashboard(url: str, cookie: str, ticks: list[int]) -> None:
    """What an open overview page asks of the hub, until cancelled: the page, the hour's
    series, then the live stream, each tick read to its end (counted in `ticks`)."""
    await read_all(url, "/ui/overview", cookie)
    json.loads(await read_all(url, "/v1/stats", cookie))
    head, chunks = await http(url, "GET", "/v1/events", cookie=cookie)
    if head.status_code != 200:
        raise SystemExit(f"GET /v1/events: {head.status_code}")
    buffer = b""
    async for chunk in chunks:
        buffer += chunk
        while b"\n\n" in buffer:
            event, _, buffer = buffer.partition(b"\n\n")
            data = [line[5:] for line in event.split(b"\n") if line.startswith(b"data:")]
            json.loads(b"".join(data))
            ticks[0] += 1
    raise SystemExit("the hub ended the dashboard's event stream")


async def dashboard_rounds(
    client: HubClient, url: str, admin_token: str, args: argparse.Namespace
) -> tuple[list[float], list[float], int, float]:
    """Tasks/s of DASHBOARD_ROUNDS rounds without and as many with a dashboard open,
    alternately; the ticks the open ones read, and the seconds they lasted."""
    off: list[float] = []
    on: list[float] = []
    ticks = [0]
    open_s = 0.0
    for _ in range(DASHBOARD_ROUNDS):
        off.append(args.tasks / await through_workers(client, args.tasks, args.clients))
        async with trio.open_nursery() as nursery:
            before = ticks[0]
            nursery.start_soon(open_dashboard, url, await sign_in(url, admin_token), ticks)
            while ticks[0] == before:  # the page is open, its stream ticking, before timing
                await trio.sleep(0.01)
            seconds = await through_workers(client, args.tasks, args.clients)
            nursery.cancel_scope.cancel()
        on.append(args.tasks / seconds)
        open_s += seconds
    return off, on, ticks[0], open_s


# ------------------------------------------------------------------------ the run


def prepare(db: Path | str) -> str:
    """QUEUE and IDLE_QUEUE in the database at `db` (a path or a URL); a credential for both."""
    store = Store(str(db))
    try:
        for queue_id in (QUEUE, IDLE_QUEUE):
            create_queue(store, queue_id, 0)
        return create_credential(store, ANY_QUEUE, frozenset({Right.PRODUCER, Right.WORKER}), 0)
    finally:
        store.close()


def admin_credential(db: Path) -> str:
    """An admin's credential in the database at `db`, to sign in to the dashboard."""
    store = Store(str(db))
    try:
        return create_credential(store, ANY_QUEUE, frozenset({Right.ADMIN}), 0)
    finally:
        store.close()


def scrape(url: str) -> dict[tuple[str, str], float]:
    """The hub's `/metrics` samples of queue QUEUE, by name and state or outcome ("" if none)."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {
        (sample.name, sample.labels.get("state") or sample.labels.get("outcome", "")): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.labels.get("queue") == QUEUE
    }


def disagreements(metrics: dict[tuple[str, str], float], found: dict[str, int]) -> list[str]:
    """Where the hub's counters and gauges differ from the tasks in the database."""
    expected: dict[tuple[str, str], int] = {
        ("blockx_hub_submissions_total", ""): sum(found.values()),
        ("blockx_hub_grants_total", ""): found.get(TaskState.SUCCEEDED, 0),
        ("blockx_hub_finishes_total", "SUCCEEDED"): found.get(TaskState.SUCCEEDED, 0),
        **{("blockx_hub_tasks", state.value): found.get(state, 0) for state in TaskState},
    }
    return [
        f"{name}{{{label}}} = {metrics.get((name, label), 0):g}, the database says {count}"
        for (name, label), count in expected.items()
        if metrics.get((name, label), 0) != count
    ]


def check_database(db: Path, expected: int, metrics: dict[tuple[str, str], float]) -> None:
    """Fail the run unless every task of QUEUE (`expected` of them) SUCCEEDED and the hub's
    metrics agree with the database."""
    found = counts(db)
    if found != {TaskState.SUCCEEDED: expected}:
        raise SystemExit(f"tasks by state after the run: {found}; expected {expected} SUCCEEDED")
    if wrong := disagreements(metrics, found):
        raise SystemExit("the hub's /metrics disagree with its database:\n" + "\n".join(wrong))


def counts(db: Path) -> dict[str, int]:
    store = Store(str(db))
    try:
        rows = store.read(
            lambda tx: tx.rows(
                "SELECT state, COUNT(*) FROM tasks WHERE queue_id = ? GROUP BY state", QUEUE
            )
        )
        return {state: int(count) for state, count in rows}
    finally:
        store.close()


async def run(args: argparse.Namespace, directory: Path) -> None:
    db = directory / "hub.sqlite3"
    token = prepare(db)
    admin_token = admin_credential(db)
    env = dict(pair.split("=", 1) for pair in args.hub_env)
    url, hub = await open_hub(db, directory, env=env)
    workers = [
        await open_worker(url, token, args.capacity, directory / f"worker{n}.log", plain=args.plain)
        for n in range(args.workers)
    ]
    pids = [process.pid for process in workers]
    client = HubClient(url=url, credential=token, keep_alive=True)
    try:
        with trio.fail_after(PHASE_TIMEOUT_S):
            await through_workers(client, WARM_UP_TASKS, args.clients)
            fresh = HubClient(url=url, credential=token)
            fresh_per_s = await submit_rate(fresh, args.tasks, args.clients)
            submits_per_s = await submit_rate(client, args.tasks, args.clients)
            with profiled(args.profile_hub, hub.pid):
                seconds, cpu = await with_cpu(
                    through_workers(client, args.tasks, args.clients), [hub.pid, *pids]
                )
            submit_ms = await submit_latencies(client, args.latency_tasks)
            commit_ms = commit_latencies(directory / "floor.sqlite3", args.latency_tasks)
            task_ms = await task_latencies(client, args.latency_tasks, WAIT_MS)
            polled_ms = await task_latencies(client, args.latency_tasks, 0)
            dashboard = (
                await dashboard_rounds(client, url, admin_token, args) if args.dashboard else None
            )
            metrics = await trio.to_thread.run_sync(scrape, url)
    finally:
        await client.aclose()
        for process in workers:
            await stop(process)
        await stop(hub)
    for n in range(args.workers):
        lines = (directory / f"worker{n}.log").read_text().splitlines()
        print(f"# worker {n}: {lines[-1] if lines else '(no output)'}", file=sys.stderr)
    rounds = 2 * DASHBOARD_ROUNDS * args.tasks if dashboard else 0
    check_database(db, WARM_UP_TASKS + args.tasks + 2 * args.latency_tasks + rounds, metrics)
    auto_per_s = args.tasks / seconds
    result("hub_submits_fresh_per_s", fresh_per_s)
    result("hub_submits_per_s", submits_per_s)
    result("auto_tasks_per_s", auto_per_s)
    result("auto_to_submit_ratio", auto_per_s / submits_per_s, 2)
    result("hub_cpu_ms_per_task", cpu[0] * 1000 / args.tasks, 2)
    result("worker_cpu_ms_per_task", sum(cpu[1:-1]) * 1000 / args.tasks, 2)
    result("producer_cpu_ms_per_task", cpu[-1] * 1000 / args.tasks, 2)
    result("submit_p50_ms", statistics.median(submit_ms), 2)
    result("sqlite_commit_p50_ms", statistics.median(commit_ms), 2)
    result("auto_latency_p50_ms", statistics.median(task_ms), 2)
    result("auto_latency_p99_ms", percentile(task_ms, 0.99), 2)
    result(
        "auto_latency_to_commit_ratio", statistics.median(task_ms) / statistics.median(commit_ms), 1
    )
    result("auto_latency_polled_p50_ms", statistics.median(polled_ms), 2)
    result("metrics_agree", 1)
    if dashboard is not None:
        report_dashboard(*dashboard)


def report_dashboard(off: list[float], on: list[float], ticks: int, open_s: float) -> None:
    print(f"# rounds without: {[round(r) for r in off]}, with: {[round(r) for r in on]}")
    if ticks < open_s:
        raise SystemExit(f"the open dashboard read {ticks} ticks in {open_s:.1f} s")
    result("dashboard_off_tasks_per_s", statistics.median(off))
    result("dashboard_on_tasks_per_s", statistics.median(on))
    result("dashboard_throughput_ratio", statistics.median(on) / statistics.median(off), 3)
    result("dashboard_ticks", ticks)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=5_000)
    parser.add_argument("--latency-tasks", type=int, default=200)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--capacity", type=int, default=8)
    parser.add_argument(
        "--hub-env", action="append", default=[], metavar="NAME=VALUE", help="e.g. HUB_POLL_MS=50"
    )
    parser.add_argument(
        "--profile-hub", metavar="PATH", help="py-spy's collapsed stacks of the hub in auto phase"
    )
    parser.add_argument(
        "--plain", action="store_true", help="the handler is a plain def (run in a thread)"
    )
    parser.add_argument(
        "--dashboard", action="store_true", help="also measure the cost of an open dashboard"
    )
    parser.add_argument("--keep", action="store_true", help="keep the directory (logs, database)")
    parser.add_argument("--worker", metavar="URL", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        trio.run(work, args.worker, args.capacity, args.plain)
        return
    run_in_a_directory(run, args, "blockx-bench-autoworker-")


def run_in_a_directory(
    run: Callable[[argparse.Namespace, Path], Awaitable[None]],
    args: argparse.Namespace,
    prefix: str,
) -> None:
    """`run(args, directory)` on Trio in a new directory, removed after unless `args.keep`."""
    directory = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        trio.run(run, args, directory)
    finally:
        if args.keep:
            print(f"# kept {directory}", file=sys.stderr)
        else:
            shutil.rmtree(directory)


if __name__ == "__main__":
    main()
