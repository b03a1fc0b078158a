"""Two worker nodes fed by a hub beside the same two nodes sent the same tasks directly.

    uv run python -m bench.fleet [--tasks 20000] [--latency-tasks 300] [--rounds 5]
                                 [--slots 128] [--executors 1] [--batch 1000]
                                 [--profile DIR] [--quick] [--keep]

One run starts a `python -m blockx hub` process on a fresh SQLite file in a
temporary directory and two worker nodes (`python -m blockx serve`,
examples/functions, SLOTS slots and EXECUTORS executors each) that also take
the tasks of the hub's queue (`--hub`, `--hub-queue`, `--hub-credential-file`).
A hub task holds its place in a node's capacity from its offer to its recorded
end, the hub's commits and round trips included, while a direct stream's node
holds what it cannot start yet itself: the hub-fed way needs more slots in
flight to keep the nodes busy, and 128 (as bench/serve.py's node has) let the
hub group a round's commits in batches about twice as large as 32 did. The
nodes do not pin their event-loop threads to one CPU (`pinLoopThreads`, on by
default, is made for one worker on a machine): each would pin them to the CPU
it starts on, and whether two nodes land on one CPU or on two is chance, on
which the direct rate depended (about 1,000 against 1,800 tasks/s on 2 cores).
Every task is the same one-call task, `demo.add(1, 2)` through the
`call_list` builder with the `result` plugin, so its value comes back with its
result: to the hub, written as a task file writes it (capability
`node_task_capability("block")`, no task id: the node names it after the hub's
task and the attempt's epoch); to a node directly, as that task file's
`TaskSpec` over `RunTasks` (`blockx.client.WorkerClient`, in this process).
After a warm-up of 100 tasks each way (as the latency phase runs them):

* direct_p50_ms, direct_p99_ms, hub_fed_p50_ms, hub_fed_p99_ms: LATENCY_TASKS
  tasks each way, one at a time, the two ways taking turns (so that whatever
  else the machine does falls on both): a direct task is written to one
  `RunTasks` stream kept open to a node (the two nodes in turn), timed from
  just before the write to the moment its `finished` is read; a hub task is
  timed from just before its submission (`POST /v1/queues/{q}/tasks`, on a
  kept connection) to the answer of `GET /v1/tasks/{id}?wait_ms=10000` that
  shows it SUCCEEDED. hub_fed_to_direct_p50: the hub's p50 over the direct one.
* direct_tasks_per_s, hub_fed_tasks_per_s: TASKS tasks each way, in ROUNDS
  rounds that take turns (direct, then through the hub, then direct, ...), each
  way's tasks over the seconds its rounds took. A direct round: its tasks over
  two `RunTasks` streams, half to each node, each stream written as fast as its
  node reads (it holds at most 64 unanswered), first write -> last `finished`
  read. A hub round: its tasks submitted in batches of BATCH
  (`HubClient.submit_many`, one transaction each, one after another), first
  submit -> the moment a count of the queue's SUCCEEDED tasks in the database,
  read every 10 ms, has grown by all of them. hub_fed_ratio: the hub's rate
  over the direct one. Each round's rates go to stderr.
* sqlite_commit_p50_ms (baseline): right after the latency phase, LATENCY_TASKS
  rows committed one per transaction to a SQLite file beside the hub's, with its
  settings (WAL, synchronous=FULL): what one durable step costs on this disk
  now. A hub task waits for three in a row (its submission with its offer, its
  start, its finish), a direct one for none.
* hub_commits_per_task_latency, hub_commits_per_task_rate: the transactions the
  hub committed over the latency phase (both ways' tasks: the direct ones move
  the nodes' free slots, which they tell the hub) and over the hub's rounds, per
  hub task (its `blockx_hub_commit_duration_seconds_count`).
* hub_cpu_ms_per_task, node_cpu_ms_per_task_hub_fed, node_cpu_ms_per_task_direct,
  producer_cpu_ms_per_task_hub_fed, producer_cpu_ms_per_task_direct: the CPU the
  hub, the two nodes (their executors included) and this process used over each
  way's rounds, per task (from /proc).

Before printing, every task must have ended SUCCEEDED exactly once with the
value 3: each direct task has one `finished`; each hub task SUCCEEDED after
one started attempt, with one attempt row and the value in its result (read
in the database); and the nodes' `blockx_tasks_finished_total` (scraped at
the end) counts as many SUCCEEDED tasks as the two paths sent, and no other.

`--profile DIR` writes py-spy's collapsed stacks of the hub and of the first
node in each round (`hub_fed<n>-hub.pyspy`, `hub_fed<n>-node0.pyspy`,
`direct<n>-node0.pyspy`; py-spy pauses a process to sample it, so the rounds
run slower). `--quick` is a smoke run (300 tasks, 30 one at a time). Prints each figure as
`RESULT name=<figure> value=<number>`; asserts nothing timed.
Targets (2 cores): hub_fed_ratio >= 0.6, hub_fed_p50_ms <= 2 x direct_p50_ms.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Final, TypeVar

import attrs
import trio
import trio_asyncio
from prometheus_client.parser import text_string_to_metric_families

from bench import autoworker
from bench.autoworker import (
    QUEUE,
    commit_latencies,
    cpu_seconds,
    free_port,
    open_hub,
    open_logged,
    percentile,
    prepare,
    result,
    run_in_a_directory,
    stop,
)
from blockx._proto.blockx.worker import v1 as pb
from blockx.autoworker import HubClient, task_submission
from blockx.client import TaskOutcome, WorkerClient, task_outputs, task_spec_from_json
from blockx.hub import Store, TaskState
from blockx.hubwire import node_task_capability

T = TypeVar("T")

REPO: Final = Path(__file__).resolve().parents[1]
TASK: Final = {
    "builder": "call_list",
    "payload": {"calls": [{"function": "demo.add", "args": [1, 2]}]},
    "plugin": "result",
}
"""The one task both paths run, as a task file writes it (with no task id)."""
VALUE: Final = 3
CAPABILITY: Final = node_task_capability("block")
NODES: Final = 2
WARM_UP_TASKS: Final = 100
WAIT_MS: Final = 10_000
DONE_POLL_S: Final = 0.01
PHASE_TIMEOUT_S: Final = 600.0
READY: Final = b"worker ready on"


# ------------------------------------------------------------------------ processes


class Node:
    """One worker node process: its gRPC and metrics addresses and its executors' pids."""

    def __init__(self, process: trio.Process, address: str, metrics: str) -> None:
        self.process = process
        self.address = address
        self.metrics = metrics
        self.pids = [process.pid]
        """The node's process and, once known, its executors'."""


async def open_node(
    n: int, hub_url: str, credential_file: Path, args: argparse.Namespace, directory: Path
) -> Node:
    """Node `n`: `blockx serve` on free loopback ports, taking QUEUE's tasks from the hub."""
    port, metrics_port = free_port(), free_port()
    command = [sys.executable, "-m", "blockx", "serve", "--listen", f"127.0.0.1:{port}"]
    command += ["--slots", str(args.slots), "--executors", str(args.executors)]
    command += ["--functions", str(REPO / "examples" / "functions")]
    command += ["--hub", hub_url, "--hub-queue", QUEUE]
    command += ["--hub-credential-file", str(credential_file)]
    env = {
        **os.environ,
        "LOG_FORMAT": "text",
        "METRICS_LISTEN": f"127.0.0.1:{metrics_port}",
        "ETCD_ENDPOINTS": "none",
        "WORKER_PIN_LOOP_THREADS": "false",  # see the module
    }
    process = await open_logged(command, env, READY, directory / f"node{n}.log")
    return Node(process, f"127.0.0.1:{port}", f"127.0.0.1:{metrics_port}")


@attrs.frozen
class Fleet:
    """What the phases drive: the hub (its database, a producer's client and its process id)
    and the nodes (a gRPC client of each)."""

    db: Path
    hub: HubClient
    hub_pid: int
    nodes: list[Node]
    clients: list[WorkerClient]


def hub_commits(fleet: Fleet) -> float:
    """Transactions the hub committed so far (its `blockx_hub_commit_duration_seconds`)."""
    with urllib.request.urlopen(f"{fleet.hub.url}/metrics", timeout=10) as response:
        text = response.read().decode()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "blockx_hub_commit_duration_seconds_count"
    )


def finished_counts(node: Node) -> dict[str, float]:
    """The node's `blockx_tasks_finished_total`, by state (and failure code, if any)."""
    with urllib.request.urlopen(f"http://{node.metrics}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {
        sample.labels["state"] + (f"/{code}" if (code := sample.labels["failure_code"]) else ""): (
            sample.value
        )
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "blockx_tasks_finished_total"
    }


# ------------------------------------------------------------------------ direct


def direct_task(task_id: str) -> pb.TaskSpec:
    return task_spec_from_json(TASK, task_id=task_id)


def check_outcome(outcome: TaskOutcome) -> None:
    """Fail the run unless the task SUCCEEDED with VALUE."""
    if outcome.result is None or not outcome.succeeded:
        raise SystemExit(f"direct task {outcome.task_id} did not succeed: {outcome}")
    if task_outputs(outcome.result) != [VALUE]:
        raise SystemExit(f"direct task {outcome.task_id} returned {outcome.result.outputs_json}")


@contextlib.asynccontextmanager
async def kept_stream(
    client: WorkerClient,
) -> AsyncIterator[Callable[[pb.TaskSpec], Awaitable[TaskOutcome]]]:
    """One `RunTasks` stream kept open: a function that writes a task to it and returns its
    outcome once read."""
    send, receive = trio.open_memory_channel[pb.TaskSpec](0)
    async with client.run_tasks(receive) as outcomes:

        async def run(task: pb.TaskSpec) -> TaskOutcome:
            await send.send(task)
            return await outcomes.receive()

        try:
            yield run
        finally:
            await send.aclose()


async def latencies(fleet: Fleet, count: int, prefix: str) -> tuple[list[float], list[float]]:
    """`count` tasks each way one at a time, a direct one (to the nodes in turn) then one
    through the hub: write -> `finished` and submission -> SUCCEEDED read back, in ms."""
    direct_ms: list[float] = []
    hub_ms: list[float] = []
    async with contextlib.AsyncExitStack() as streams:
        runs = [await streams.enter_async_context(kept_stream(c)) for c in fleet.clients]
        for n in range(count):
            task = direct_task(f"{prefix}-{n}")
            started = time.perf_counter()
            outcome = await runs[n % len(runs)](task)
            direct_ms.append((time.perf_counter() - started) * 1000)
            check_outcome(outcome)
            hub_ms.append(await hub_latency(fleet.hub))
    return direct_ms, hub_ms


async def direct_rate(clients: list[WorkerClient], count: int, prefix: str) -> float:
    """Seconds from the first write to the last `finished` of `count` tasks over one
    `RunTasks` stream per node, each with its share."""
    ended: set[str] = set()

    async def one_stream(client: WorkerClient, first: int) -> None:
        tasks = (direct_task(f"{prefix}-{n}") for n in range(first, count, len(clients)))
        async with client.run_tasks(tasks) as outcomes:
            async for outcome in outcomes:
                check_outcome(outcome)
                if outcome.task_id in ended:
                    raise SystemExit(f"direct task {outcome.task_id} ended twice")
                ended.add(outcome.task_id)

    started = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for n, client in enumerate(clients):
            nursery.start_soon(one_stream, client, n)
    seconds = time.perf_counter() - started
    if len(ended) != count:
        raise SystemExit(f"{len(ended)} of {count} direct tasks ended")
    return seconds


# ------------------------------------------------------------------------ through the hub


async def hub_latency(client: HubClient) -> float:
    """One task: submission -> SUCCEEDED read back, in ms."""
    started = time.perf_counter()
    task = await client.submit(QUEUE, CAPABILITY, TASK)
    while task["state"] != TaskState.SUCCEEDED:
        if task["state"] in (TaskState.FAILED, TaskState.NEEDS_REVIEW):
            raise SystemExit(f"a hub task ended {task['state']}: {json.dumps(task)}")
        task = await client.task(task["task_id"], wait_ms=WAIT_MS)
    elapsed_ms = (time.perf_counter() - started) * 1000
    if task["result"].get("outputs") != [VALUE]:
        raise SystemExit(f"a hub task returned {json.dumps(task['result'])}")
    return elapsed_ms


def succeeded(store: Store) -> int:
    rows = store.read(
        lambda tx: tx.rows(
            "SELECT COUNT(*) FROM tasks WHERE queue_id = ? AND state = 'SUCCEEDED'", QUEUE
        )
    )
    return int(rows[0][0])


async def hub_rate(fleet: Fleet, count: int, batch: int) -> float:
    """Seconds from the first submission of `count` tasks, in batches of `batch`, to the
    moment the queue has `count` more SUCCEEDED tasks."""
    store = Store(str(fleet.db))
    try:
        before = await trio.to_thread.run_sync(succeeded, store)
        document = task_submission(CAPABILITY, TASK)
        started = time.perf_counter()
        for first in range(0, count, batch):
            answers = await fleet.hub.submit_many(QUEUE, [document] * min(batch, count - first))
            if refused := [answer for answer in answers if answer["status"] != 201]:
                raise SystemExit(f"{len(refused)} submissions refused, the first: {refused[0]}")
        while await trio.to_thread.run_sync(succeeded, store) < before + count:
            await trio.sleep(DONE_POLL_S)
        return time.perf_counter() - started
    finally:
        store.close()


def hub_counts(db: Path) -> tuple[int, int]:
    """Tasks of QUEUE; those SUCCEEDED with VALUE after exactly one attempt (one started,
    one row)."""
    store = Store(str(db))
    try:
        rows = store.read(
            lambda tx: tx.rows(
                "SELECT COUNT(*), SUM(CASE WHEN t.state = 'SUCCEEDED' AND t.started_attempts = 1"
                " AND (SELECT COUNT(*) FROM attempts a WHERE a.task_id = t.task_id) = 1"
                " AND json_extract(t.result, '$.outputs') = ? THEN 1 ELSE 0 END)"
                " FROM tasks t WHERE t.queue_id = ?",
                json.dumps([VALUE]),
                QUEUE,
            )
        )
        return int(rows[0][0]), int(rows[0][1] or 0)
    finally:
        store.close()


# ------------------------------------------------------------------------ the run


async def with_cpu(phase: Awaitable[T], groups: dict[str, list[int]]) -> tuple[T, dict[str, float]]:
    """What `phase` returns, and the CPU seconds each group of pids used ("producer": this
    process)."""

    def read() -> dict[str, float]:
        used = {name: sum(cpu_seconds(pid) for pid in pids) for name, pids in groups.items()}
        return {**used, "producer": time.process_time()}

    before = read()
    value = await phase
    after = read()
    return value, {name: after[name] - before[name] for name in after}


@contextlib.contextmanager
def profiled(directory: Path | None, phase: str, pids: dict[str, int]) -> Iterator[None]:
    """Samples each of `pids` with py-spy while the block runs: collapsed stacks in
    `directory`/<phase>-<name>.pyspy (nothing without a directory)."""
    if directory is None:
        yield
        return
    directory.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        for name, pid in pids.items():
            stack.enter_context(autoworker.profiled(str(directory / f"{phase}-{name}.pyspy"), pid))
        yield


def check_all(db: Path, nodes: list[Node], hub_tasks: int, direct_tasks: int) -> None:
    """Fail the run unless every task ended SUCCEEDED exactly once (see the module)."""
    tasks, once = hub_counts(db)
    if tasks != hub_tasks or once != tasks:
        raise SystemExit(
            f"hub: {tasks} tasks of {hub_tasks} sent, {once} SUCCEEDED with {VALUE} after "
            "exactly one attempt"
        )
    counts: dict[str, float] = {}
    for node in nodes:
        for state, value in finished_counts(node).items():
            counts[state] = counts.get(state, 0) + value
    if counts != {"SUCCEEDED": hub_tasks + direct_tasks}:
        raise SystemExit(
            f"the nodes finished {counts}; {hub_tasks + direct_tasks} SUCCEEDED were sent"
        )


async def run(args: argparse.Namespace, directory: Path) -> None:
    db = directory / "hub.sqlite3"
    credential_file = directory / "credential"
    credential_file.write_text(prepare(db))
    url, hub = await open_hub(db, directory)
    nodes: list[Node] = []
    client = HubClient(url=url, credential=credential_file.read_text(), keep_alive=True)
    try:
        for n in range(NODES):
            nodes.append(await open_node(n, url, credential_file, args, directory))
        async with trio_asyncio.open_loop(), contextlib.AsyncExitStack() as stack:
            clients = [
                await stack.enter_async_context(WorkerClient.connect(node.address))
                for node in nodes
            ]
            for node, worker in zip(nodes, clients, strict=True):
                node.pids += [executor.pid for executor in (await worker.status()).executors]
            fleet = Fleet(db=db, hub=client, hub_pid=hub.pid, nodes=nodes, clients=clients)
            with trio.fail_after(PHASE_TIMEOUT_S):
                figures = await measure(args, fleet)
        sent = int(figures.pop("sent"))
        await trio.to_thread.run_sync(check_all, db, nodes, sent, sent)
    finally:
        await client.aclose()
        for node in nodes:
            await stop(node.process)
        await stop(hub)
    for name, value in figures.items():
        result(name, value, 0 if name.endswith("per_s") else 2)


async def measure(args: argparse.Namespace, fleet: Fleet) -> dict[str, float]:
    """The figures of the run (see the module), and how many tasks each way sent."""
    nodes = fleet.nodes
    groups = {"hub": [fleet.hub_pid], "nodes": [pid for node in nodes for pid in node.pids]}
    await latencies(fleet, WARM_UP_TASKS, "warm")
    commits = await trio.to_thread.run_sync(hub_commits, fleet)
    direct_ms, hub_ms = await latencies(fleet, args.latency_tasks, "latency")
    latency_commits = await trio.to_thread.run_sync(hub_commits, fleet) - commits
    floor = fleet.db.parent / "floor.sqlite3"
    commit_ms = await trio.to_thread.run_sync(commit_latencies, floor, args.latency_tasks)
    rate_commits = 0.0
    seconds = {"direct": 0.0, "hub": 0.0}
    cpu: dict[str, dict[str, float]] = {"direct": {}, "hub": {}}
    sampled = {"hub": fleet.hub_pid, "node0": nodes[0].process.pid}
    for n, count in enumerate(shares(args.tasks, args.rounds)):
        with profiled(args.profile, f"direct{n}", {"node0": sampled["node0"]}):
            direct_s, used = await with_cpu(direct_rate(fleet.clients, count, f"rate{n}"), groups)
        seconds["direct"] += direct_s
        cpu["direct"] = added(cpu["direct"], used)
        commits = await trio.to_thread.run_sync(hub_commits, fleet)
        with profiled(args.profile, f"hub_fed{n}", sampled):
            hub_s, used = await with_cpu(hub_rate(fleet, count, args.batch), groups)
        rate_commits += await trio.to_thread.run_sync(hub_commits, fleet) - commits
        seconds["hub"] += hub_s
        cpu["hub"] = added(cpu["hub"], used)
        print(
            f"# round {n}: {count} tasks each way, direct {count / direct_s:.0f}/s, "
            f"hub-fed {count / hub_s:.0f}/s",
            file=sys.stderr,
            flush=True,
        )
    direct_per_s, hub_per_s = args.tasks / seconds["direct"], args.tasks / seconds["hub"]
    sent = WARM_UP_TASKS + args.latency_tasks + args.tasks
    ms_per_task = 1000 / args.tasks
    return {
        "hub_fed_tasks_per_s": hub_per_s,
        "direct_tasks_per_s": direct_per_s,
        "hub_fed_ratio": hub_per_s / direct_per_s,
        "hub_fed_p50_ms": statistics.median(hub_ms),
        "hub_fed_p99_ms": percentile(hub_ms, 0.99),
        "direct_p50_ms": statistics.median(direct_ms),
        "direct_p99_ms": percentile(direct_ms, 0.99),
        "hub_fed_to_direct_p50": statistics.median(hub_ms) / statistics.median(direct_ms),
        "hub_cpu_ms_per_task": cpu["hub"]["hub"] * ms_per_task,
        "node_cpu_ms_per_task_hub_fed": cpu["hub"]["nodes"] * ms_per_task,
        "node_cpu_ms_per_task_direct": cpu["direct"]["nodes"] * ms_per_task,
        "producer_cpu_ms_per_task_hub_fed": cpu["hub"]["producer"] * ms_per_task,
        "producer_cpu_ms_per_task_direct": cpu["direct"]["producer"] * ms_per_task,
        "sqlite_commit_p50_ms": statistics.median(commit_ms),
        "hub_commits_per_task_latency": latency_commits / args.latency_tasks,
        "hub_commits_per_task_rate": rate_commits / args.tasks,
        "sent": sent,
    }


def added(sums: dict[str, float], more: dict[str, float]) -> dict[str, float]:
    return {name: sums.get(name, 0.0) + value for name, value in more.items()}


def shares(count: int, rounds: int) -> list[int]:
    """`count` split over `rounds` as evenly as it goes."""
    return [count // rounds + (1 if n < count % rounds else 0) for n in range(rounds)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=20_000, help="tasks of each rate phase")
    parser.add_argument("--latency-tasks", type=int, default=300, help="tasks timed one at a time")
    parser.add_argument("--slots", type=int, default=128, help="each node's task slots")
    parser.add_argument("--executors", type=int, default=1, help="each node's executors")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rate rounds")
    parser.add_argument("--batch", type=int, default=1_000, help="hub submissions per request")
    parser.add_argument(
        "--profile", type=Path, metavar="DIR", help="py-spy stacks of the hub and a node"
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run: 300 tasks, 30 timed")
    parser.add_argument("--keep", action="store_true", help="keep the directory (logs, database)")
    args = parser.parse_args()
    if args.quick:
        args.tasks, args.latency_tasks = 300, 30
    run_in_a_directory(run, args, "blockx-bench-fleet-")


if __name__ == "__main__":
    main()
