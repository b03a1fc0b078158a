"""Acknowledged transitions per second of a hub on SQLite, against SQLite's own commit floor.

    uv run python bench/hub.py [--tasks 20000] [--leases 64] [--repeats 3] [--dir DIR]

* hub: a `python -m blockx hub` process on a fresh SQLite file (the default
  store: WAL, synchronous=FULL), with TASKS tasks queued. One scripted worker
  holds LEASES attempts at a time over the WebSocket protocol: every offer is
  started at once, every grant finished at once with a small JSON result,
  pipelined, the next offer arriving as a finish frees a place. Each task
  makes three transitions, each committed before it is acknowledged: offered
  (a new attempt), started (a lease), succeeded. hub_transitions_per_s is
  3 x TASKS over the time from the session's opening to the last finish's
  acknowledgement.
* floor: this process committing one row per transaction to a SQLite file in
  the same directory with the same settings, as fast as it can: what one
  fsync per acknowledged transition would allow at best.

Each is run `--repeats` times and the medians are reported. Prints
`RESULT name=hub_transitions_per_s`, `RESULT name=sqlite_floor_commits_per_s`,
`RESULT name=hub_to_floor_ratio` and `RESULT name=hub_tasks_per_s`.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import trio
import trio_websocket

from blockx.hub import (
    Idempotency,
    Right,
    Store,
    Submission,
    TaskState,
    create_credential,
    create_queue,
)
from blockx.hub._ops import TimeOrderedIds, submit
from blockx.hubwire import (
    MAX_FRAME_BYTES,
    PROTOCOL_VERSION,
    Capability,
    Finish,
    Granted,
    Hello,
    Message,
    Offer,
    OpenSession,
    Recorded,
    Start,
    Succeeded,
    Welcome,
    decode,
    encode,
)

QUEUE = "bench"
CAPABILITY = Capability(handler="bench.echo", handler_version="1", payload_version="1")
RESULT = Succeeded(result='{"ok":true}')
FLOOR_SECONDS = 3.0
START_TIMEOUT_S = 30.0


def prepare(path: Path, tasks: int) -> str:
    """A hub database with `tasks` queued tasks; the worker credential's token."""
    store = Store(str(path))
    try:
        create_queue(store, QUEUE, 0)
        token = create_credential(store, QUEUE, frozenset({Right.WORKER, Right.PRODUCER}), 0)
        now_ms = int(time.time() * 1000)
        submission = Submission(
            queue_id=QUEUE,
            capability=CAPABILITY,
            payload='{"n":1}',
            idempotency=Idempotency.IDEMPOTENT,
            max_attempts=3,
            total_deadline_ms=3_600_000,
            attempt_timeout_ms=300_000,
        )
        ids = TimeOrderedIds(lambda: now_ms)
        store.run_batch([submit(submission, now_ms, ids) for _ in range(tasks)])
        return token
    finally:
        store.close()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def start_hub(db: Path, port: int) -> trio.Process:
    env = {**os.environ, "LOG_FORMAT": "text", "HUB_POLL_MS": "200"}
    command = [sys.executable, "-m", "blockx", "hub", "--db", str(db)]
    process = await trio.lowlevel.open_process(
        [*command, "--listen", f"127.0.0.1:{port}"],
        stdin=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
    )
    assert process.stderr is not None
    seen = b""
    with trio.fail_after(START_TIMEOUT_S):
        while b"listening on" not in seen:
            chunk = await process.stderr.receive_some()
            if not chunk:
                raise SystemExit(f"the hub did not start:\n{seen.decode(errors='replace')}")
            seen += chunk
    return process


async def drive(port: int, token: str, tasks: int, leases: int) -> float:
    """Run every task through claim -> start -> finish; seconds from session to last ack."""
    url = f"ws://127.0.0.1:{port}/v1/worker"
    async with trio_websocket.open_websocket_url(url, max_message_size=MAX_FRAME_BYTES) as ws:
        await ws.send_message(encode([Hello(protocol_version=PROTOCOL_VERSION, credential=token)]))
        welcome = decode(await ws.get_message())
        assert isinstance(welcome[0], Welcome), welcome
        ids = iter(range(1, 1 << 62))
        started = time.perf_counter()
        opened = OpenSession(
            message_id="open",
            instance_id="bench",
            queue_id=QUEUE,
            capabilities=(CAPABILITY,),
            capacity=leases,
        )
        await ws.send_message(encode([opened]))
        done = 0
        epochs: dict[str, int] = {}
        while done < tasks:
            replies: list[Message] = []
            for message in decode(await ws.get_message()):
                match message:
                    case Offer(attempt_id=attempt_id, epoch=epoch):
                        epochs[attempt_id] = epoch
                        replies.append(
                            Start(message_id=f"s{next(ids)}", attempt_id=attempt_id, epoch=epoch)
                        )
                    case Granted(attempt_id=attempt_id):
                        replies.append(
                            Finish(
                                message_id=f"f{next(ids)}",
                                attempt_id=attempt_id,
                                epoch=epochs.pop(attempt_id),
                                outcome=RESULT,
                            )
                        )
                    case Recorded():
                        done += 1
                    case _:
                        pass
            if replies:
                await ws.send_message(encode(replies))
        return time.perf_counter() - started


def succeeded(db: Path) -> int:
    store = Store(str(db))
    try:
        rows = store.read(
            lambda tx: tx.rows("SELECT COUNT(*) FROM tasks WHERE state = ?", TaskState.SUCCEEDED)
        )
        return int(rows[0][0])
    finally:
        store.close()


async def hub_run(directory: Path, tasks: int, leases: int) -> float:
    db = directory / "hub.sqlite3"
    token = prepare(db, tasks)
    port = free_port()
    process = await start_hub(db, port)
    try:
        seconds = await drive(port, token, tasks, leases)
    finally:
        process.kill()
        await process.wait()
    ok = succeeded(db)
    if ok != tasks:
        raise SystemExit(f"{ok} of {tasks} tasks SUCCEEDED in the database after the run")
    for name in ("hub.sqlite3", "hub.sqlite3-wal", "hub.sqlite3-shm"):
        (directory / name).unlink(missing_ok=True)
    return 3 * tasks / seconds


def floor_run(directory: Path) -> float:
    """Commits per second, one row per transaction, WAL and synchronous=FULL as the hub."""
    path = directory / "floor.sqlite3"
    connection = sqlite3.connect(path, isolation_level=None)
    connection.execute("PRAGMA journal_mode = WAL")
    connection.execute("PRAGMA synchronous = FULL")
    connection.execute("CREATE TABLE rows (row_id INTEGER PRIMARY KEY, value TEXT NOT NULL)")
    commits = 0
    started = time.perf_counter()
    while (elapsed := time.perf_counter() - started) < FLOOR_SECONDS:
        connection.execute("BEGIN IMMEDIATE")
        connection.execute("INSERT INTO rows (value) VALUES (?)", ('{"ok":true}',))
        connection.execute("COMMIT")
        commits += 1
    connection.close()
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    return commits / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=20_000)
    parser.add_argument("--leases", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dir", help="where the databases go (default: a temporary directory)")
    args = parser.parse_args()
    directory = Path(tempfile.mkdtemp(prefix="blockx-bench-hub-", dir=args.dir))
    try:
        hub, floor = [], []
        for repeat in range(args.repeats):
            hub.append(trio.run(hub_run, directory, args.tasks, args.leases))
            floor.append(floor_run(directory))
            print(f"run {repeat + 1}: hub {hub[-1]:,.0f} transitions/s, "
                  f"floor {floor[-1]:,.0f} commits/s", file=sys.stderr)  # fmt: skip
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    hub_median, floor_median = statistics.median(hub), statistics.median(floor)
    print(f"RESULT name=hub_transitions_per_s value={hub_median:.0f}")
    print(f"RESULT name=sqlite_floor_commits_per_s value={floor_median:.0f}")
    print(f"RESULT name=hub_to_floor_ratio value={hub_median / floor_median:.2f}")
    print(f"RESULT name=hub_tasks_per_s value={hub_median / 3:.0f}")


if __name__ == "__main__":
    main()
