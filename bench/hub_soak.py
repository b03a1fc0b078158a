"""A hub's database stays bounded under retention: its size on disk over 100,000 tasks.

    uv run python -m bench.hub_soak [--tasks 100000] [--rate 300] [--retention-ms 10000]
                                    [--clients 32] [--workers 2] [--capacity 8] [--keep]

One run starts a `python -m blockx hub` process on a fresh SQLite file with
`HUB_TASK_RETENTION_MS` and `HUB_RECEIPT_RETENTION_MS` set to RETENTION_MS,
and WORKERS automatic workers (`bench/autoworker.py --worker`, a handler
that returns its payload). CLIENTS producers each submit a task and wait for
its end (`GET /v1/tasks/{id}?wait_ms=...`), then the next, RATE tasks a
second in all, until TASKS have run: the queue stays short and the load
steady, so what the database holds is what retention keeps of RATE x
RETENTION_MS tasks (an unpaced run's rate would follow whatever else the
machine does). Every 250 ms the size of the database file and its WAL is
sampled.

* db_bytes_peak: the largest size in the first retention window: from the
  start until twice the retention after the first task ended (once for the
  first tasks to fall due, once more for the deletion to keep up).
* db_bytes_end: the size once every task has ended (the hub still running, so
  its WAL is counted as in every sample); db_bytes_end_to_peak: the
  ratio (the target is <= 1.2: SQLite files never shrink without VACUUM, so
  a bounded database is one whose freed pages are reused and stops growing).
* tasks_kept_end: the tasks the database still holds at the end (about
  the tasks of one retention, never all of them); tasks_per_s.

Prints each figure as `RESULT name=<figure> value=<number>`; never asserts.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Final

import trio

from bench.autoworker import (
    CAPABILITY,
    QUEUE,
    open_hub,
    open_worker,
    prepare,
    result,
    run_in_a_directory,
    stop,
)
from blockx.autoworker import HubClient
from blockx.hub import Store, TaskState

SAMPLE_S: Final = 0.25
WAIT_MS: Final = 10_000
RUN_TIMEOUT_S: Final = 1_800.0


def db_bytes(db: Path) -> int:
    """The database file and its write-ahead log, as they are on disk now."""
    return sum(path.stat().st_size for path in (db, Path(f"{db}-wal")) if path.exists())


async def produce(args: argparse.Namespace, client: HubClient, ended: list[float]) -> None:
    """`args.tasks` tasks from `args.clients` producers, `args.rate` a second in all, each
    producer waiting for its task's end before its next; `ended` gets the first end's time."""
    numbers = iter(range(args.tasks))
    started = trio.current_time()

    async def one_producer() -> None:
        for n in numbers:
            await trio.sleep_until(started + n / args.rate)
            task = await client.submit(QUEUE, CAPABILITY, {"n": n})
            while task["state"] not in (TaskState.SUCCEEDED, TaskState.FAILED):
                if task["state"] == TaskState.NEEDS_REVIEW:
                    raise SystemExit(f"a task needs review: {task}")
                task = await client.request("GET", f"/v1/tasks/{task['task_id']}?wait_ms={WAIT_MS}")
            if not ended:
                ended.append(time.monotonic())

    async with trio.open_nursery() as nursery:
        for _ in range(args.clients):
            nursery.start_soon(one_producer)


async def sample(db: Path, samples: list[tuple[float, int]]) -> None:
    while True:
        samples.append((time.monotonic(), db_bytes(db)))
        await trio.sleep(SAMPLE_S)


async def run(args: argparse.Namespace, directory: Path) -> None:
    db = directory / "hub.sqlite3"
    token = prepare(db)
    retention = str(args.retention_ms)
    env = {"HUB_TASK_RETENTION_MS": retention, "HUB_RECEIPT_RETENTION_MS": retention}
    url, hub = await open_hub(db, directory, env=env)
    workers = [
        await open_worker(url, token, args.capacity, directory / f"w{n}.log")
        for n in range(args.workers)
    ]
    client = HubClient(url=url, credential=token, keep_alive=True)
    samples: list[tuple[float, int]] = []
    ended: list[float] = []
    try:
        with trio.fail_after(RUN_TIMEOUT_S):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(sample, db, samples)
                started = time.monotonic()
                await produce(args, client, ended)
                seconds = time.monotonic() - started
                nursery.cancel_scope.cancel()
        samples.append((time.monotonic(), db_bytes(db)))  # the hub still runs: WAL included
    finally:
        await client.aclose()
        for process in workers:
            await stop(process)
        await stop(hub)
    report(db, samples, ended[0] + 2 * args.retention_ms / 1000, args.tasks / seconds)


def report(db: Path, samples: list[tuple[float, int]], window_end: float, per_s: float) -> None:
    peak = max(size for at, size in samples if at <= window_end)
    end = samples[-1][1]
    store = Store(str(db))
    try:
        kept = store.read(
            lambda tx: tx.rows("SELECT COUNT(*) FROM tasks WHERE queue_id = ?", QUEUE)
        )
    finally:
        store.close()
    if samples[-1][0] <= window_end:
        print(
            "# the run ended within its first retention window: use more --tasks", file=sys.stderr
        )
    result("db_bytes_peak", peak)
    result("db_bytes_end", end)
    result("db_bytes_end_to_peak", end / peak, 2)
    result("tasks_kept_end", kept[0][0])
    result("tasks_per_s", per_s)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=100_000)
    parser.add_argument("--rate", type=float, default=300.0, help="tasks submitted a second")
    parser.add_argument("--retention-ms", type=int, default=10_000)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--capacity", type=int, default=8)
    parser.add_argument("--keep", action="store_true", help="keep the directory (logs, database)")
    args = parser.parse_args()
    run_in_a_directory(run, args, "blockx-bench-hub-soak-")


if __name__ == "__main__":
    main()
