"""Faults between an automatic worker and a real hub, each ending as the runtime promises.

A `python -m blockx hub` on SQLite; the worker (`blockx.autoworker`) runs in
this process, or in a process of its own (tests/e2e/autoworker_runner.py) when
it is to be killed, and reaches the hub through a loopback proxy the test
steers (tests/e2e/tcp_proxy.py):

* the WebSocket dropped mid-task: the worker reconnects, resumes the attempt,
  which goes on and succeeds, once;
* an answer lost (its frame eaten, then the connection reset), or a report
  lost on its way: the worker sends the request again under its message id
  after reconnecting and the hub's receipt answers; the handler ran once;
* a partition longer than the lease: the handler's lease monitor cancels it,
  its report (UNKNOWN / LEASE_LOST) arrives late and is kept as evidence only,
  and the task is retried (IDEMPOTENT) or waits for review (NON_IDEMPOTENT);
* the hub killed (SIGKILL) and started again on the same database: the worker
  reconnects with back-off, resumes, and nothing acknowledged is lost;
* the worker process killed mid-task: once the lease ends the hub retries an
  IDEMPOTENT task (another worker runs it) and parks a NON_IDEMPOTENT one.

Each runs twice (`hub_tls`): in plain text (HTTP and WS), and with the hub
serving HTTPS and WSS and every client trusting the test CA; then the proxy
speaks TLS on both of its legs, so it still sees (and eats) whole frames.

Wall-clock time: the hub is another process. Conditions are waited for (the
hub's API polled, the worker's notices, the messages the proxy saw) under
`fail_after`, never slept for.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Final

import attrs
import pytest
import trio

from blockx.autoworker import (
    HubClient,
    Worker,
    WorkerEvent,
    WorkerExecution,
    WorkerHandler,
    WorkerOptions,
)
from blockx.hubwire import (
    AttemptStatus,
    Disposition,
    Finish,
    Granted,
    Message,
    Recorded,
    Renew,
    Resume,
    Resumed,
    Start,
)
from tests.adapters.certificates import Pki
from tests.adapters.hub_harness import CAPABILITY, QUEUE
from tests.e2e.autoworker_runner import STARTED
from tests.e2e.hub_process import HubProcess, hub_process, queue_with_credential
from tests.e2e.serve_process import REPO
from tests.e2e.tcp_proxy import TO_HUB, TO_WORKER, TcpProxy, tcp_proxy

LEASE_MS: Final = 1_500
ENV: Final = {
    "HUB_LEASE_MS": str(LEASE_MS),
    "HUB_POLL_MS": "20",
    "HUB_RETRY_BACKOFF_MS": "1",
    "HUB_MAX_RETRY_BACKOFF_MS": "1",
    "LOG_FORMAT": "text",
}
FAIL_AFTER_S: Final = 30
"""A bound far above what each case takes (3 to 10 s), for a loaded machine."""
POLL_S: Final = 0.02
ENDED: Final = ("SUCCEEDED", "FAILED", "NEEDS_REVIEW")

Handle = Callable[[WorkerExecution], Awaitable[Any]]


def options(handle: Handle, *, capacity: int = 1) -> WorkerOptions:
    return WorkerOptions(
        queue_id=QUEUE,
        handlers=[WorkerHandler(capability=CAPABILITY, handle=handle)],
        capacity=capacity,
        shutdown_timeout_ms=5_000,
        reconnect_min_delay_ms=20,
        reconnect_max_delay_ms=200,
    )


@attrs.define(eq=False)
class Running:
    """A running worker and the notices it gave so far."""

    worker: Worker
    seen: list[WorkerEvent] = attrs.Factory(list)
    _changed: trio.Event = attrs.Factory(trio.Event)
    _scope: trio.CancelScope = attrs.Factory(trio.CancelScope)
    _stopped: trio.Event = attrs.Factory(trio.Event)

    async def run(self) -> None:
        try:
            with self._scope:
                await self.worker.run()
        finally:
            self._stopped.set()

    async def collect(self) -> None:
        async for event in self.worker.events():
            self.seen.append(event)
            self._changed.set()
            self._changed = trio.Event()

    async def wait_for(self, type_: str, count: int = 1) -> WorkerEvent:
        """The `count`-th notice of `type_`, once given."""
        while True:
            found = [event for event in self.seen if event.type == type_]
            if len(found) >= count:
                return found[count - 1]
            await self._changed.wait()

    async def stop(self) -> None:
        """Drain the worker, which must end in time (its `run` raises otherwise)."""
        self._scope.cancel()
        await self._stopped.wait()


@asynccontextmanager
async def running(worker: Worker) -> AsyncIterator[Running]:
    """`worker` runs; it is stopped (drained) on exit unless it was already."""
    running = Running(worker=worker)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(running.run)
        nursery.start_soon(running.collect)
        yield running
        await running.stop()


def proxied_worker(proxy: TcpProxy, token: str, handle: Handle, *, capacity: int = 1) -> Worker:
    """A worker that reaches the hub through `proxy` (trusting its CA, over TLS)."""
    client = HubClient(url=proxy.url, credential=token, ca_file=proxy.ca_file)
    return Worker(client, options(handle, capacity=capacity))


@attrs.define(eq=False)
class Rig:
    hub: HubProcess
    proxy: TcpProxy
    token: str

    def worker(self, handle: Handle, *, capacity: int = 1) -> Worker:
        return proxied_worker(self.proxy, self.token, handle, capacity=capacity)

    async def submit(self, idempotency: str = "NON_IDEMPOTENT", **payload: Any) -> str:
        task = await self.hub.submit(self.token, payload=payload, idempotency=idempotency)
        return str(task["task_id"])

    async def settled(self, task_id: str, *states: str) -> dict[str, Any]:
        """The task (from the hub directly, not through the proxy) once in one of `states`."""
        while True:
            task = await self.hub.task(self.token, task_id)
            if task["state"] in (states or ENDED):
                return task
            await trio.sleep(POLL_S)


@asynccontextmanager
async def faulty_hub(tmp_path: Path, tls: Pki | None) -> AsyncIterator[Rig]:
    """A hub process on a fresh SQLite database, and a proxy to it (TLS with `tls`)."""
    db = str(tmp_path / "hub.sqlite3")
    token = queue_with_credential(db, QUEUE)
    async with hub_process(db, ENV, tls) as hub, tcp_proxy(hub.port, tls) as proxy:
        yield Rig(hub=hub, proxy=proxy, token=token)


def attempt_states(task: dict[str, Any]) -> list[str]:
    return [attempt["state"] for attempt in task["attempts"]]


# --------------------------------------------------------------- the connection dropped


async def test_a_websocket_dropped_mid_task_is_resumed_and_the_attempt_goes_on(
    tmp_path: Path, hub_tls: Pki | None
) -> None:
    runs: list[str] = []
    release = trio.Event()

    async def handle(execution: WorkerExecution) -> Any:
        runs.append(execution.attempt_id)
        await release.wait()
        return {"echo": execution.payload}

    with trio.fail_after(FAIL_AFTER_S):
        async with faulty_hub(tmp_path, hub_tls) as rig:
            worker = rig.worker(handle)
            async with running(worker) as notices:
                task_id = await rig.submit(n=1)
                await notices.wait_for("started")
                rig.proxy.drop()
                dropped = len(rig.proxy.heard)
                await notices.wait_for("reconnected")
                # The lease is renewed on the new connection before the handler returns.
                resumed = await rig.proxy.wait_for(TO_WORKER, Resumed, since=dropped)
                renewed = await rig.proxy.wait_for(TO_WORKER, Granted, since=dropped)
                release.set()
                task = await rig.settled(task_id)
                await notices.wait_for("confirmed")
            stats = worker.stats()
    assert [a.status for a in resumed.attempts] == [AttemptStatus.RUNNING]
    assert renewed.reply_to in {renew.message_id for renew in rig.proxy.messages(TO_HUB, Renew)}
    assert (task["state"], task["result"]) == ("SUCCEEDED", {"echo": {"n": 1}})
    assert attempt_states(task) == ["SUCCEEDED"]
    assert runs == [task["attempts"][0]["attempt_id"]]
    assert stats.reconnects >= 1
    assert (stats.started, stats.reports_confirmed) == (1, 1)


# --------------------------------------------------------------------- a lost frame


@pytest.mark.parametrize(
    ("direction", "kind"),
    [(TO_WORKER, Recorded), (TO_WORKER, Granted), (TO_HUB, Finish)],
    ids=["recorded-lost", "granted-lost", "finish-lost"],
)
async def test_a_lost_frame_is_made_good_by_resending_under_the_same_message_id(
    tmp_path: Path, hub_tls: Pki | None, direction: str, kind: type[Message]
) -> None:
    """The frame is eaten, then the connection reset (a frame is lost only with its
    connection): the reconnected worker resumes and resends what was unanswered."""
    runs: list[str] = []

    async def handle(execution: WorkerExecution) -> Any:
        runs.append(execution.attempt_id)
        return {"echo": execution.payload}

    with trio.fail_after(FAIL_AFTER_S):
        async with faulty_hub(tmp_path, hub_tls) as rig:
            eaten = rig.proxy.eat(direction, kind)
            worker = rig.worker(handle)
            async with running(worker) as notices:
                task_id = await rig.submit(n=2)
                await eaten.wait()
                rig.proxy.drop()
                await notices.wait_for("reconnected")
                task = await rig.settled(task_id)
                await notices.wait_for("confirmed")
            stats = worker.stats()
    assert (task["state"], task["result"]) == ("SUCCEEDED", {"echo": {"n": 2}})
    assert attempt_states(task) == ["SUCCEEDED"]
    assert task["evidence"] == []
    assert runs == [task["attempts"][0]["attempt_id"]]  # the handler ran once
    assert (stats.started, stats.reports_confirmed, stats.evidence_confirmed) == (1, 1, 0)
    starts = rig.proxy.messages(TO_HUB, Start)
    finishes = rig.proxy.messages(TO_HUB, Finish)
    recorded = rig.proxy.messages(TO_WORKER, Recorded)
    if kind is Granted:
        # Resume found the attempt running: it runs under that lease, its start not resent.
        [resumed] = rig.proxy.messages(TO_WORKER, Resumed)
        assert [a.status for a in resumed.attempts] == [AttemptStatus.RUNNING]
        assert len(starts) == 1
        assert len(finishes) == 1
    else:
        # The finish went again with its message id; the hub decided once (ACCEPTED).
        assert len(finishes) == 2
        assert finishes[0] == finishes[1]
        # The second answer is the hub's receipt of the first (when that one was lost).
        assert len(recorded) == (2 if kind is Recorded else 1)
        assert {r.disposition for r in recorded} == {Disposition.ACCEPTED}
    assert len(rig.proxy.messages(TO_HUB, Resume)) == 1


# ------------------------------------------------------------ a partition past the lease


@pytest.mark.parametrize(
    ("idempotency", "reset"),
    [("IDEMPOTENT", False), ("NON_IDEMPOTENT", True)],
    ids=["idempotent-healed", "not-idempotent-reset"],
)
async def test_a_partition_longer_than_the_lease_cancels_the_handler_and_the_hub_decides(
    tmp_path: Path, hub_tls: Pki | None, idempotency: str, reset: bool
) -> None:
    """Nothing gets through, both ways, for longer than the lease; then the held bytes go
    on (`reset` False) or every connection is reset and the worker reconnects."""
    runs: list[str] = []
    cancelled: list[str] = []
    cut_off = trio.Event()

    async def handle(execution: WorkerExecution) -> Any:
        runs.append(execution.attempt_id)
        if len(runs) == 1:
            try:
                await trio.sleep_forever()
            except trio.Cancelled:
                cancelled.append(execution.attempt_id)
                cut_off.set()
                raise
        return {"echo": execution.payload}

    with trio.fail_after(FAIL_AFTER_S):
        async with faulty_hub(tmp_path, hub_tls) as rig:
            worker = rig.worker(handle)
            async with running(worker) as notices:
                task_id = await rig.submit(idempotency, n=3)
                await notices.wait_for("started")
                rig.proxy.partition()
                await cut_off.wait()  # the lease monitor, with no word from the hub
                lost = await notices.wait_for("lease_lost")
                expired = await rig.settled(task_id, "QUEUED", "OFFERED", "NEEDS_REVIEW")
                rig.proxy.heal(reset=reset)
                late = await notices.wait_for("confirmed")
                task = await rig.settled(task_id)
            stats = worker.stats()
    first = expired["attempts"][0]
    assert cancelled == [first["attempt_id"]] == [lost.attempt_id]
    assert first["state"] == "LEASE_EXPIRED"  # the hub ended it, not the report
    assert (late.attempt_id, late.detail) == (first["attempt_id"], "EVIDENCE_ONLY")
    assert stats.evidence_confirmed == 1
    [evidence] = task["evidence"]
    assert evidence["attempt_id"] == first["attempt_id"]
    assert evidence["detail"] == {"reported": "UNKNOWN", "code": "LEASE_LOST"}
    if idempotency == "IDEMPOTENT":
        assert (task["state"], task["result"]) == ("SUCCEEDED", {"echo": {"n": 3}})
        assert attempt_states(task) == ["LEASE_EXPIRED", "SUCCEEDED"]
        assert runs == [a["attempt_id"] for a in task["attempts"]]
    else:
        assert task["state"] == "NEEDS_REVIEW"
        assert attempt_states(task) == ["LEASE_EXPIRED"]
        assert runs == [first["attempt_id"]]
    if reset:
        assert stats.reconnects >= 1


# ------------------------------------------------------------------ the hub killed


async def test_a_hub_killed_and_started_again_loses_nothing_the_worker_was_told(
    tmp_path: Path, hub_tls: Pki | None
) -> None:
    """Three tasks: the first succeeds (its report acknowledged) before the hub is killed;
    the second's handler returns while the hub is down; the third still runs when a hub
    is back on the same database, behind the same address. The leases outlast the
    outage, so the worker resumes both attempts and every task succeeds on its first."""
    db = str(tmp_path / "hub.sqlite3")
    token = queue_with_credential(db, QUEUE)
    env = {**ENV, "HUB_LEASE_MS": "30000"}  # far longer than a hub takes to start
    release = [trio.Event() for _ in range(3)]
    release[0].set()
    runs: list[int] = []

    async def handle(execution: WorkerExecution) -> Any:
        n = execution.payload["n"]
        runs.append(n)
        await release[n].wait()
        return {"n": n}

    with trio.fail_after(FAIL_AFTER_S):
        async with tcp_proxy(0, hub_tls) as proxy:
            worker = proxied_worker(proxy, token, handle, capacity=3)
            async with running(worker) as notices:
                async with hub_process(db, env, hub_tls) as first:
                    rig = Rig(hub=first, proxy=proxy, token=token)
                    proxy.retarget(first.port)
                    ids = [await rig.submit(n=n) for n in range(3)]
                    acknowledged = await notices.wait_for("confirmed")
                    await notices.wait_for("started", count=3)
                    await first.kill()
                    await notices.wait_for("disconnected")
                    release[1].set()
                    await notices.wait_for("returned", count=2)  # its report waits
                tried = proxy.accepted
                while proxy.accepted < tried + 2:  # the worker keeps trying, backing off
                    await trio.sleep(POLL_S)
                async with hub_process(db, env, hub_tls) as second:
                    rig.hub = second
                    proxy.retarget(second.port)
                    await notices.wait_for("reconnected")
                    release[2].set()
                    tasks = [await rig.settled(task_id) for task_id in ids]
                    await notices.wait_for("confirmed", count=3)
                    await notices.stop()
            stats = worker.stats()
    assert acknowledged.task_id == ids[0]
    assert [(t["state"], t["result"]) for t in tasks] == [("SUCCEEDED", {"n": n}) for n in range(3)]
    assert [attempt_states(t) for t in tasks] == [["SUCCEEDED"]] * 3
    assert sorted(runs) == [0, 1, 2]
    assert [t["evidence"] for t in tasks] == [[], [], []]
    assert stats.reconnects >= 1
    assert (stats.started, stats.reports_confirmed) == (3, 3)
    # Resume found both attempts still running under their leases.
    resumed = proxy.messages(TO_WORKER, Resumed)
    assert {(a.attempt_id, a.status) for r in resumed for a in r.attempts} == {
        (t["attempts"][0]["attempt_id"], AttemptStatus.RUNNING) for t in tasks[1:]
    }


# --------------------------------------------------------------- the worker killed


@attrs.define(eq=False)
class WorkerProcess:
    """tests/e2e/autoworker_runner.py running, and the lines it printed so far."""

    process: trio.Process
    lines: list[str] = attrs.Factory(list)
    _changed: trio.Event = attrs.Factory(trio.Event)

    async def pump(self, stdout: trio.abc.ReceiveStream) -> None:
        buffer = b""
        async for chunk in stdout:
            *lines, buffer = (buffer + chunk).split(b"\n")
            self.lines.extend(line.decode() for line in lines)
            self._changed.set()
            self._changed = trio.Event()

    async def started(self, count: int) -> list[tuple[str, str]]:
        """(task id, attempt id) of the first `count` attempts it started."""
        while True:
            found = [line.split()[1:] for line in self.lines if line.startswith(STARTED)]
            if len(found) >= count:
                return [(task_id, attempt_id) for task_id, attempt_id in found[:count]]
            await self._changed.wait()

    async def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        await self.process.wait()
        assert self.process.returncode == -signal.SIGKILL


@asynccontextmanager
async def worker_process(
    proxy: TcpProxy, token: str, capacity: int
) -> AsyncIterator[WorkerProcess]:
    """An automatic worker in a process of its own, reaching the hub through `proxy`;
    killed on exit if it still runs."""
    command = [sys.executable, "-m", "tests.e2e.autoworker_runner", proxy.url, str(capacity)]
    env = {**os.environ, "HUB_TOKEN": token, "HUB_CA_FILE": proxy.ca_file}
    async with trio.open_nursery() as nursery:
        process = await trio.lowlevel.open_process(
            command, stdout=subprocess.PIPE, env=env, cwd=REPO
        )
        assert process.stdout is not None
        worker = WorkerProcess(process=process)
        nursery.start_soon(worker.pump, process.stdout)
        try:
            yield worker
        finally:
            if process.returncode is None:
                process.kill()
            with trio.CancelScope(shield=True):
                await process.wait()
            nursery.cancel_scope.cancel()


async def test_a_killed_worker_process_leaves_its_attempts_to_the_hub(
    tmp_path: Path, hub_tls: Pki | None
) -> None:
    """A worker process holds two attempts when it is killed; once their leases end the
    hub queues the IDEMPOTENT task again (a worker started after the kill runs it) and
    parks the other for review. Nothing the killed process knew survives it."""
    runs: list[str] = []

    async def handle(execution: WorkerExecution) -> Any:
        runs.append(execution.task_id)
        return {"echo": execution.payload}

    with trio.fail_after(FAIL_AFTER_S):
        async with faulty_hub(tmp_path, hub_tls) as rig:
            retried = await rig.submit("IDEMPOTENT", n=5)
            parked = await rig.submit("NON_IDEMPOTENT", n=6)
            async with worker_process(rig.proxy, rig.token, capacity=2) as doomed:
                held = await doomed.started(2)
                await doomed.kill()
            successor = rig.worker(handle, capacity=2)
            async with running(successor) as notices:
                await notices.wait_for("confirmed")
                tasks = {task_id: await rig.settled(task_id) for task_id in (retried, parked)}
    assert sorted(task_id for task_id, _ in held) == sorted([retried, parked])
    first = {task_id: tasks[task_id]["attempts"][0] for task_id in tasks}
    assert {a["attempt_id"] for a in first.values()} == {attempt_id for _, attempt_id in held}
    assert [a["state"] for a in first.values()] == ["LEASE_EXPIRED", "LEASE_EXPIRED"]
    task = tasks[retried]
    assert (task["state"], task["result"]) == ("SUCCEEDED", {"echo": {"n": 5}})
    assert attempt_states(task) == ["LEASE_EXPIRED", "SUCCEEDED"]
    second = task["attempts"][1]
    assert second["instance_id"] == successor.instance_id != first[retried]["instance_id"]
    assert second["offered_at_ms"] >= first[retried]["lease_deadline_ms"]
    assert (tasks[parked]["state"], attempt_states(tasks[parked])) == (
        "NEEDS_REVIEW",
        ["LEASE_EXPIRED"],
    )
    assert runs == [retried]
