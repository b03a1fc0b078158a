"""A fleet under faults, end to end: two hubs on one PostgreSQL, three worker nodes.

Two `python -m blockx hub` processes share one PostgreSQL database; three
`python -m blockx serve` nodes (two executors and two slots each) take the
queue's tasks, two through hub A and one through hub B. 600 IDEMPOTENT tasks
each upsert one row by key into a PostgreSQL table (`table_upserts`); 30
NON_IDEMPOTENT tasks each insert a row of their own run (key, run id), so a
second run of one shows as a second row. Half the tasks are submitted
through each hub. Five of them hold their first run where the test wants it
(the call leaves its pid in a marker file and waits for a release file; a
later run returns at once); each node is the only one with a free slot when
its holds are submitted:

* the node on hub B runs two IDEMPOTENT holds. It is stopped (SIGSTOP) for
  longer than its leases: the hub retries both elsewhere, and once they
  SUCCEEDED there the node goes on (SIGCONT) and reports its old attempts,
  late. The hub must keep those reports as evidence and nothing more;
* the next node (hub A) runs an IDEMPOTENT hold whose call the node may not
  retry (`retry.max_attempts` 1) and a NON_IDEMPOTENT hold. The first one's
  executor is killed (SIGKILL): the task fails EXECUTOR_LOST on the node,
  which the hub must hear as a retryable failure and run again. Then the
  node itself is killed (SIGKILL) while it also runs another task: its
  executors must notice their closed socket and exit, its attempts lapse
  (the NON_IDEMPOTENT hold waits for review, the others run again);
* the third node (hub A) runs an IDEMPOTENT hold. Hub A is killed (SIGKILL)
  and stays down until that hold's lease has run out (hub B ends it as
  expired): the node must end its task for the lost lease, free its slot and
  report late once hub A is back on its port, and it goes on from there.

At the end, every IDEMPOTENT task SUCCEEDED and its row is in the table once
with its value; every NON_IDEMPOTENT task SUCCEEDED (its row there once) or
waits for review (its row there at most once); no attempt was ended by a
report that came after its lease ran out, and a task that SUCCEEDED did so
by its newest attempt, alone; the two nodes still up hold no slot (their
status, as `blockx status` reads it); no executor of the killed node is
left. Then the test checks that each fault did what is said above.

Wall-clock time: the system under test is processes. The test waits for
marker files, the hub's view of tasks and the nodes' status, polled under a
deadline, never slept for.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import uuid
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Final

import attrs
import psycopg
import trio

from blockx._proto.blockx.worker import v1 as pb
from blockx.autoworker import HubClient, task_submission
from blockx.client import WorkerClient
from blockx.hub import Right, Store, create_credential, create_queue
from blockx.hubwire import node_task_capability
from tests.e2e.hub_process import HubProcess, hub_process
from tests.e2e.postgres_server import PostgresServer, create_database, descendants
from tests.e2e.processes import parent_of, wait_exited
from tests.e2e.serve_process import ServeProcess, serve_process

QUEUE: Final = "fleet"
IDEMPOTENT: Final = 600
NON_IDEMPOTENT: Final = 30
MAX_ATTEMPTS: Final = 8
"""Enough for a task caught by every fault in turn: none of them may fail a task for want
of attempts."""
LEASE_MS: Final = 3_000
HUB_ENV: Final = {
    "HUB_LEASE_MS": str(LEASE_MS),
    "HUB_OFFER_TTL_MS": "2000",
    "HUB_SESSION_TTL_MS": "2000",
    "HUB_POLL_MS": "20",
    "HUB_RETRY_BACKOFF_MS": "20",
    "HUB_MAX_RETRY_BACKOFF_MS": "200",
    "LOG_FORMAT": "text",
}
"""Short leases and offers, so that a dead or stopped node's attempts lapse in seconds."""
NODE_CONFIG: Final = {"executorHeartbeatTimeoutMs": 60_000}
"""A stopped node reads its executors' heartbeats only once it goes on: it must not take
their silence meanwhile for death."""
HELD_PRIORITY: Final = 9
"""The held tasks go before the others, again when they are retried: the test waits for
them."""
FAIL_AFTER_S: Final = 100
EXECUTORS_EXIT_S: Final = 10
"""How long the killed node's executors may take to notice and exit."""
POLL_S: Final = 0.05
LIVE: Final = ("QUEUED", "OFFERED", "RUNNING")
REPORTED: Final = ("SUCCEEDED", "FAILED", "UNKNOWN")
"""The states of an attempt its worker's report ended."""

STOPPED_HOLDS: Final = ("idem-0", "idem-1")
LOST_HOLD: Final = "idem-2"
OUTAGE_HOLD: Final = "idem-3"
"""Held by the survivor while its hub is down for longer than the lease."""
KILLED_HOLD: Final = "once-0"
HOLDS: Final = (*STOPPED_HOLDS, LOST_HOLD, OUTAGE_HOLD, KILLED_HOLD)

FUNCTIONS: Final = '''
"""The calls of the fleet's tasks."""

import os
import time
import uuid


def row(key, value):
    """An IDEMPOTENT task's row: the same on every run."""
    return {"key": key, "value": value}


def stamp(key):
    """A NON_IDEMPOTENT task's row: this run's own, so that a second run adds one."""
    return {"key": key, "run": uuid.uuid4().hex}


def hold(marker, release, key, value=None):
    """The first run leaves its pid in `marker` and waits for `release` (the test faults
    its process meanwhile); a later run goes on at once. Then `row`, or `stamp` without
    a value."""
    if not os.path.exists(marker):
        with open(marker + ".tmp", "w") as out:
            out.write(str(os.getpid()))
        os.rename(marker + ".tmp", marker)
        deadline = time.monotonic() + 60
        while not os.path.exists(release) and time.monotonic() < deadline:
            time.sleep(0.01)
    return stamp(key) if value is None else row(key, value)
'''

TABLES: Final = (
    "CREATE TABLE idem_rows (key BIGINT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE once_rows (key BIGINT NOT NULL, run TEXT NOT NULL, PRIMARY KEY (key, run))",
)
"""Made before any task runs: tasks that made them (`create`) at once would race."""


def key_of(task_id: str) -> int:
    return int(task_id.rsplit("-", 1)[1])


@attrs.frozen
class Fleet:
    """What the nodes and the tasks share: the queue's credential, the function code, the
    nodes' settings, the database the tasks write to, the holds' marker files."""

    output_db: str
    token: str
    credential_file: Path
    functions: Path
    config_file: Path
    markers: Path

    @classmethod
    def prepare(cls, postgres: PostgresServer, hub_db: str, tmp_path: Path) -> Fleet:
        store = Store(hub_db)
        try:
            create_queue(store, QUEUE, 0)
            token = create_credential(store, QUEUE, frozenset({Right.PRODUCER, Right.WORKER}), 0)
        finally:
            store.close()
        name = f"out_{uuid.uuid4().hex[:16]}"
        create_database(postgres.admin_url, name)
        output_db = f"postgresql://{postgres.user}@127.0.0.1:{postgres.port}/{name}"
        with psycopg.connect(output_db) as connection:
            for table in TABLES:
                connection.execute(table)
        credential_file = tmp_path / "credential"
        credential_file.write_text(token)
        functions = tmp_path / "functions"
        functions.mkdir()
        (functions / "fleet.py").write_text(FUNCTIONS)
        config_file = tmp_path / "worker.json"
        config_file.write_text(json.dumps(NODE_CONFIG))
        markers = tmp_path / "markers"
        markers.mkdir()
        return cls(
            output_db=output_db,
            token=token,
            credential_file=credential_file,
            functions=functions,
            config_file=config_file,
            markers=markers,
        )

    def producer(self, hub: HubProcess) -> HubClient:
        return HubClient(url=hub_url(hub), credential=self.token, keep_alive=True)

    @asynccontextmanager
    async def node(self, hub: HubProcess) -> AsyncIterator[ServeProcess]:
        """A worker node taking the queue's tasks from `hub`, once it is ready."""
        args = ("--executors", "2", "--slots", "2", "--functions", str(self.functions))
        hub_args = ("--hub", hub_url(hub), "--hub-queue", QUEUE)
        env = {"WORKER_CONFIG": str(self.config_file), "LOG_FORMAT": "text"}
        credential = ("--hub-credential-file", str(self.credential_file))
        async with serve_process(*args, *hub_args, *credential, env=env) as node:
            yield node

    # ------------------------------------------------------------------ tasks

    def task(self, task_id: str, call: dict[str, Any], **fields: Any) -> dict[str, Any]:
        """The submission of a task that runs `call` and writes its row, as a task file
        writes it (`fields`: the task file's other keys)."""
        idempotent = task_id.startswith("idem-")
        table, key = ("idem_rows", "key") if idempotent else ("once_rows", ["key", "run"])
        document = {
            "builder": "call_list",
            "payload": {"calls": [call]},
            "plugin": "table_upserts",
            "plugin_config": {"database": self.output_db, "table": table, "key": key},
            **fields,
        }
        return task_submission(
            node_task_capability("block"),
            document,
            task_id=task_id,
            idempotency="IDEMPOTENT" if idempotent else "NON_IDEMPOTENT",
            max_attempts=MAX_ATTEMPTS,
        )

    def plain(self, task_id: str) -> dict[str, Any]:
        key = key_of(task_id)
        if task_id.startswith("idem-"):
            return self.task(task_id, {"function": "fleet.row", "args": [key, value_of(key)]})
        return self.task(task_id, {"function": "fleet.stamp", "args": [key]})

    def hold(self, task_id: str, **fields: Any) -> dict[str, Any]:
        key = key_of(task_id)
        args: list[object] = [str(self.marker(task_id)), str(self.release_file), key]
        if task_id.startswith("idem-"):
            args.append(value_of(key))
        call = {"function": "fleet.hold", "args": args}
        return {**self.task(task_id, call, **fields), "priority": HELD_PRIORITY}

    def marker(self, task_id: str) -> Path:
        return self.markers / task_id

    @property
    def release_file(self) -> Path:
        return self.markers / "release"

    async def held(self, node: ServeProcess, *task_ids: str) -> list[int]:
        """The pids of the executors of `node` that run the first runs of `task_ids`, once
        each has begun."""
        pids = []
        for task_id in task_ids:
            marker = self.marker(task_id)
            while not marker.exists():
                await trio.sleep(POLL_S)
            pid = int(marker.read_text())
            assert parent_of(pid) == node.process.pid, f"{task_id} runs in {pid}, not on the node"
            pids.append(pid)
        return pids

    def rows(self) -> tuple[dict[int, list[str]], dict[int, int]]:
        """The values written for each IDEMPOTENT key, and the runs written for each
        NON_IDEMPOTENT key."""
        values: dict[int, list[str]] = {}
        runs: dict[int, int] = {}
        with psycopg.connect(self.output_db) as connection:
            for key, value in connection.execute("SELECT key, value FROM idem_rows"):
                values.setdefault(key, []).append(value)
            for key, count in connection.execute(
                "SELECT key, count(*) FROM once_rows GROUP BY key"
            ):
                runs[key] = count
        return values, runs


def hub_url(hub: HubProcess) -> str:
    return f"http://127.0.0.1:{hub.port}"


def value_of(key: int) -> str:
    return f"value-{key}"


def bulk() -> tuple[list[str], list[str]]:
    """The ids of the tasks that hold nothing, NON_IDEMPOTENT ones spread among the others,
    split in two halves (one for each hub)."""
    idempotent = [f"idem-{key}" for key in range(4, IDEMPOTENT)]
    others = [f"once-{key}" for key in range(1, NON_IDEMPOTENT)]
    every = len(idempotent) // len(others)
    ids: list[str] = []
    for index, task_id in enumerate(idempotent):
        ids.append(task_id)
        if index % every == every - 1 and others:
            ids.append(others.pop(0))
    ids += others
    return ids[::2], ids[1::2]


# ---------------------------------------------------------------------- the hub's view


async def submit(producer: HubClient, documents: list[dict[str, Any]]) -> None:
    answers = await producer.submit_many(QUEUE, documents)
    refused = [answer for answer in answers if answer["status"] != 201]
    assert not refused, refused


async def task_until(
    producer: HubClient, task_id: str, done: Callable[[dict[str, Any]], bool]
) -> dict[str, Any]:
    """Task `task_id` once `done` says so of it."""
    while not done(task := await producer.task(task_id)):
        await trio.sleep(POLL_S)
    return task


async def all_ended(producer: HubClient) -> None:
    """Until no task of the queue is queued, offered or running."""
    while True:
        for state in LIVE:
            path = f"/v1/queues/{QUEUE}/tasks?state={state}&limit=1"
            listed = await producer.request("GET", path)
            if listed["tasks"]:
                break
        else:
            return
        await trio.sleep(POLL_S)


async def read_tasks(producer: HubClient, task_ids: Iterable[str]) -> dict[str, dict[str, Any]]:
    """Every task of `task_ids` with its attempts, evidence and history."""
    tasks: dict[str, dict[str, Any]] = {}
    waiting = iter(task_ids)

    async def reader() -> None:
        for task_id in waiting:
            tasks[task_id] = await producer.task(task_id)

    async with trio.open_nursery() as nursery:
        for _ in range(4):
            nursery.start_soon(reader)
    return tasks


def first_state(task: dict[str, Any]) -> str:
    state: str = task["attempts"][0]["state"]
    return state


def late_report_arrived(task: dict[str, Any]) -> bool:
    """Whether the report of the task's first attempt reached the hub: as evidence, or as
    the attempt's end (which the checks then judge)."""
    first = task["attempts"][0]
    return first["state"] in REPORTED or any(
        entry["attempt_id"] == first["attempt_id"] for entry in task["evidence"]
    )


# ---------------------------------------------------------------------- the nodes' view


async def status(node: ServeProcess) -> pb.GetWorkerStatusResponse:
    """The node's status as `blockx status` reads it, on a channel of the loop that runs
    now (the innermost node's: a node's own stub is bound to the loop it was made in)."""
    async with WorkerClient.connect(f"127.0.0.1:{node.port}") as client:
        return await client.status()


async def executors_up(node: ServeProcess, count: int) -> list[int]:
    """The pids of the node's executors once `count` of them are connected."""
    while True:
        up = [e.pid for e in (await status(node)).executors if e.state in ("READY", "BUSY")]
        if len(up) == count:
            return up
        await trio.sleep(POLL_S)


async def idle(node: ServeProcess) -> pb.GetWorkerStatusResponse:
    """The node's status once it holds no slot."""
    while True:
        now = await status(node)
        if now.reserved_slots == now.running_tasks == 0 and now.free_slots == now.slots_total:
            return now
        await trio.sleep(POLL_S)


# ---------------------------------------------------------------------- the checks


def attempt_problems(task: dict[str, Any]) -> list[str]:
    """What is wrong with how the task's attempts ended: a report taken after its lease
    ran out (such a report is evidence only), or a success that is not the task's newest
    attempt's alone."""
    problems = []
    name = task["task_id"]
    for attempt in task["attempts"]:
        reported_at, lease = attempt["finished_at_ms"], attempt["lease_deadline_ms"]
        if attempt["state"] in REPORTED and reported_at >= lease:
            problems.append(
                f"{name}: attempt {attempt['epoch']} ended {attempt['state']} by a report at "
                f"{reported_at}, after its lease ran out at {lease}"
            )
    succeeded = [a["epoch"] for a in task["attempts"] if a["state"] == "SUCCEEDED"]
    if task["state"] == "SUCCEEDED":
        newest = task["attempts"][-1]
        if succeeded != [newest["epoch"]]:
            problems.append(f"{name}: attempts {succeeded} succeeded, of {len(task['attempts'])}")
        elif task["result"] != newest["outcome"]["result"]:
            problems.append(f"{name}: its result is not its succeeded attempt's")
    elif succeeded:
        problems.append(f"{name} is {task['state']}, yet attempts {succeeded} succeeded")
    return problems


def shown(task: dict[str, Any]) -> str:
    attempts = [(a["state"], (a["outcome"] or {}).get("code")) for a in task["attempts"]]
    return f"{task['task_id']} {task['state']} {task['failure']} attempts {attempts}"


def check_outcomes(
    tasks: dict[str, dict[str, Any]], values: dict[int, list[str]], runs: dict[int, int]
) -> None:
    idempotent = {i: t for i, t in tasks.items() if i.startswith("idem-")}
    others = {i: t for i, t in tasks.items() if i.startswith("once-")}
    assert (len(idempotent), len(others)) == (IDEMPOTENT, NON_IDEMPOTENT)
    unfinished = [shown(t) for t in idempotent.values() if t["state"] != "SUCCEEDED"]
    assert not unfinished, f"IDEMPOTENT tasks that did not succeed: {unfinished}"
    assert values == {key: [value_of(key)] for key in range(IDEMPOTENT)}
    wrong = [shown(t) for t in others.values() if t["state"] not in ("SUCCEEDED", "NEEDS_REVIEW")]
    assert not wrong, f"NON_IDEMPOTENT tasks neither succeeded nor waiting for review: {wrong}"
    twice = {key: count for key, count in runs.items() if count > 1}
    assert not twice, f"NON_IDEMPOTENT tasks whose effect is there more than once: {twice}"
    missing = [i for i, t in others.items() if t["state"] == "SUCCEEDED" and key_of(i) not in runs]
    assert not missing, f"NON_IDEMPOTENT tasks that succeeded without their effect: {missing}"
    problems = [problem for task in tasks.values() for problem in attempt_problems(task)]
    assert not problems, problems


def check_scenario(tasks: dict[str, dict[str, Any]], runs: dict[int, int]) -> None:
    """The faults did what the scenario says: the checks above saw what they are for."""
    for task_id in (*STOPPED_HOLDS, OUTAGE_HOLD):
        task = tasks[task_id]
        first = task["attempts"][0]
        assert first["state"] == "LEASE_EXPIRED", shown(task)
        late = [e for e in task["evidence"] if e["attempt_id"] == first["attempt_id"]]
        assert late, f"no late report of the attempt whose lease ran out: {task['history']}"
    lost = tasks[LOST_HOLD]["attempts"][0]
    assert lost["state"] == "FAILED", shown(tasks[LOST_HOLD])
    assert (lost["outcome"]["code"], lost["outcome"]["retryable"]) == ("EXECUTOR_LOST", True)
    killed = tasks[KILLED_HOLD]
    assert killed["state"] == "NEEDS_REVIEW", shown(killed)
    assert [a["state"] for a in killed["attempts"]] == ["LEASE_EXPIRED"], shown(killed)
    assert key_of(KILLED_HOLD) not in runs


# ---------------------------------------------------------------------- the scenario


async def kill_node(node: ServeProcess) -> None:
    """SIGKILL the node once both its executors are up and it runs a task beside its hold;
    each of its executors exits within `EXECUTORS_EXIT_S` (it notices its socket closed),
    whatever call it runs."""
    executors = await executors_up(node, 2)
    while (await status(node)).running_tasks < 2:
        await trio.sleep(POLL_S)
    below = descendants(node.process.pid)
    node.process.send_signal(signal.SIGKILL)
    await node.process.wait()
    with trio.fail_after(EXECUTORS_EXIT_S):
        for pid in {*executors, *below}:
            await wait_exited(pid)


def go_on(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGCONT)


async def test_a_fleet_under_faults_runs_each_task_to_its_end_with_its_effect_once(
    postgres: PostgresServer, postgres_url: str, tmp_path: Path
) -> None:
    fleet = await trio.to_thread.run_sync(Fleet.prepare, postgres, postgres_url, tmp_path)
    through_a, through_b = bulk()
    with trio.fail_after(FAIL_AFTER_S):
        async with contextlib.AsyncExitStack() as stack:
            hub_a = await stack.enter_async_context(hub_process(postgres_url, HUB_ENV))
            hub_b = await stack.enter_async_context(hub_process(postgres_url, HUB_ENV))
            producer_a, producer_b = fleet.producer(hub_a), fleet.producer(hub_b)
            stack.push_async_callback(producer_a.aclose)
            stack.push_async_callback(producer_b.aclose)
            # Each node is the only one with room when its holds are submitted: it runs them.
            stopped = await stack.enter_async_context(fleet.node(hub_b))
            await submit(producer_b, [fleet.hold(task_id) for task_id in STOPPED_HOLDS])
            await fleet.held(stopped, *STOPPED_HOLDS)
            killed = await stack.enter_async_context(fleet.node(hub_a))
            # The node may not run the lost hold's call again: its task fails EXECUTOR_LOST.
            lost_hold = fleet.hold(LOST_HOLD, retry={"max_attempts": 1})
            await submit(producer_a, [lost_hold, fleet.hold(KILLED_HOLD)])
            lost_pid, _ = await fleet.held(killed, LOST_HOLD, KILLED_HOLD)
            survivor = await stack.enter_async_context(fleet.node(hub_a))
            await submit(producer_a, [fleet.hold(OUTAGE_HOLD)])
            await fleet.held(survivor, OUTAGE_HOLD)
            await submit(producer_a, [fleet.plain(task_id) for task_id in through_a])
            await submit(producer_b, [fleet.plain(task_id) for task_id in through_b])

            os.kill(stopped.process.pid, signal.SIGSTOP)
            stack.callback(go_on, stopped.process.pid)  # however the test ends
            os.kill(lost_pid, signal.SIGKILL)
            await task_until(producer_b, LOST_HOLD, lambda t: first_state(t) != "RUNNING")
            await kill_node(killed)
            await hub_a.kill()
            # Hub B sweeps what lapses meanwhile; the survivor ends its attempts itself.
            await task_until(producer_b, OUTAGE_HOLD, lambda t: first_state(t) != "RUNNING")
            hub_a = await stack.enter_async_context(
                hub_process(postgres_url, HUB_ENV, port=hub_a.port)
            )
            # Retried on the survivor (back on hub A) while the node is stopped; then the
            # stopped node goes on, and reports its attempts late.
            for task_id in STOPPED_HOLDS:
                await task_until(producer_b, task_id, lambda t: t["state"] not in LIVE)
            go_on(stopped.process.pid)
            fleet.release_file.touch()
            for task_id in (*STOPPED_HOLDS, OUTAGE_HOLD):
                await task_until(producer_b, task_id, late_report_arrived)

            await all_ended(producer_b)
            for node in (survivor, stopped):
                await idle(node)
                assert node.process.returncode is None, node.log[-20:]
            tasks = await read_tasks(producer_b, [*HOLDS, *through_a, *through_b])
    values, runs = await trio.to_thread.run_sync(fleet.rows)
    check_outcomes(tasks, values, runs)
    check_scenario(tasks, runs)
