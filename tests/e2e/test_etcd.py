"""Registration and placement against a real etcd and real `blockx serve` processes (and
one `Registrar` in the test's own process, whose heartbeat the test changes).

Each test starts its own etcd (loopback, a temporary data dir, free ports,
fast raft timing) and its workers. What a worker wrote is read back with the
project's own etcd client; waiting for a change is a watch on the key, never
a sleep. Every test runs under `fail_after`.
"""

from __future__ import annotations

import contextlib
import json
import re
import signal
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import attrs
import pytest
import trio
import trio_asyncio

from blockx._proto.blockx.worker import v1 as pb
from blockx.client import NoWorkerAvailable, PlacementClient, WorkerClient
from blockx.discovery import EtcdClient, KeyEventKind, Registrar, WorkerHeartbeat
from tests.e2e.etcd_server import EtcdServer, etcd_server
from tests.e2e.serve_process import REPO, ServeProcess, serve_process

PREFIX = "/blockx/workers/"
FAIL_AFTER_S = 60
SHORT_TTL_MS = 2_000
EXPIRY_SLACK_S = 1.5
"""etcd checks for expired leases about every 500 ms; the rest is a loaded machine."""


def worker_env(etcd: EtcdServer, **extra: str) -> dict[str, str]:
    return {"ETCD_ENDPOINTS": etcd.endpoint, **extra}


def key_of(worker: ServeProcess) -> str:
    return f"{PREFIX}127.0.0.1:{worker.port}"


def sleeper(task_id: str, seconds: float = 30) -> pb.TaskSpec:
    payload = {"calls": [{"function": "demo.sleep", "args": [seconds]}]}
    return pb.TaskSpec(
        task_id=task_id,
        function_call=pb.FunctionCallConfig(type="call_list"),
        payload=json.dumps(payload).encode(),
    )


@contextlib.asynccontextmanager
async def etcd_client(etcd: EtcdServer) -> AsyncIterator[EtcdClient]:
    async with trio_asyncio.open_loop(), EtcdClient.connect([etcd.endpoint]) as client:
        yield client


async def heartbeat_at(
    etcd: EtcdClient,
    key: str,
    matches: Callable[[WorkerHeartbeat], bool] = lambda _: True,
    *,
    written_after: int = 0,
) -> WorkerHeartbeat:
    """Until `key` holds a heartbeat that `matches`, written after revision `written_after`."""
    snapshot = await etcd.get_prefix(key)
    for entry_key, value, mod_revision in snapshot.entries:
        if entry_key == key and mod_revision > written_after:
            heartbeat = WorkerHeartbeat.from_json(value)
            if matches(heartbeat):
                return heartbeat
    start = max(snapshot.revision, written_after) + 1
    async with contextlib.aclosing(etcd.watch_prefix(key, start_revision=start)) as batches:
        async for events in batches:
            for event in events:
                if event.key == key and event.kind is KeyEventKind.PUT:
                    heartbeat = WorkerHeartbeat.from_json(event.value)
                    if matches(heartbeat):
                        return heartbeat
    raise AssertionError("the watch ended")


async def key_deleted(etcd: EtcdClient, key: str) -> None:
    """Until `key` does not exist."""
    snapshot = await etcd.get_prefix(key)
    if not any(entry_key == key for entry_key, _, _ in snapshot.entries):
        return
    start = snapshot.revision + 1
    async with contextlib.aclosing(etcd.watch_prefix(key, start_revision=start)) as batches:
        async for events in batches:
            if any(e.key == key and e.kind is KeyEventKind.DELETE for e in events):
                return


@attrs.define
class Heartbeats:
    """A heartbeat a test changes, counting the registrar's reads of it."""

    free_slots: int = 2
    reads: int = 0
    _awaited: tuple[int, trio.Event] | None = None

    async def read(self) -> WorkerHeartbeat:
        self.reads += 1
        if self._awaited is not None and self.reads >= self._awaited[0]:
            self._awaited[1].set()
        return WorkerHeartbeat(
            address="127.0.0.1:1",
            deployment="block",
            slots_total=2,
            reserved_slots=2 - self.free_slots,
            running_tasks=0,
            free_slots=self.free_slots,
            executors_healthy=1,
            draining=False,
            version="0",
            started_at_ms=1,
        )

    async def more_reads(self, count: int) -> None:
        """Until the registrar has read the heartbeat `count` more times (so it has finished
        with every read before those: it reads, then puts or not, then waits)."""
        read = trio.Event()
        self._awaited = (self.reads + count, read)
        await read.wait()


async def test_a_registrar_puts_the_heartbeat_when_it_changes_and_only_then(
    tmp_path: Path,
) -> None:
    heartbeats = Heartbeats()
    key = PREFIX + "127.0.0.1:1"
    with trio.fail_after(FAIL_AFTER_S):
        async with (
            etcd_server(tmp_path / "etcd") as etcd,
            etcd_client(etcd) as client,
            trio.open_nursery() as nursery,
        ):
            registrar = Registrar(
                endpoints=[etcd.endpoint],
                key=key,
                lease_ttl_ms=10_000,
                heartbeat_interval_ms=10,
                heartbeat_refresh_ms=3_600_000,  # never, in this test
                heartbeat=heartbeats.read,
            )
            await nursery.start(registrar.run)
            await heartbeat_at(client, key)
            registered = await client.get_prefix(key)

            await heartbeats.more_reads(20)  # twenty looks at an unchanged heartbeat
            assert (await client.get_prefix(key)).entries == registered.entries  # not put again
            assert registrar.puts == 1

            heartbeats.free_slots = 1
            changed = await heartbeat_at(client, key, written_after=registered.revision)
            assert (changed.free_slots, changed.reserved_slots) == (1, 1)
            await heartbeats.more_reads(20)
            assert registrar.puts == 2

            await registrar.deregister()
            await key_deleted(client, key)


async def test_a_ready_worker_registers_its_heartbeat_under_a_lease(tmp_path: Path) -> None:
    with trio.fail_after(FAIL_AFTER_S):
        async with (
            etcd_server(tmp_path / "etcd") as etcd,
            etcd_client(etcd) as client,
            serve_process("--slots", "3", "--executors", "1", env=worker_env(etcd)) as worker,
        ):
            heartbeat = await heartbeat_at(client, key_of(worker))

            assert heartbeat.address == f"127.0.0.1:{worker.port}"
            assert heartbeat.deployment == "block"
            assert (heartbeat.slots_total, heartbeat.free_slots) == (3, 3)
            assert (heartbeat.reserved_slots, heartbeat.running_tasks) == (0, 0)
            assert heartbeat.executors_healthy == 1
            assert heartbeat.draining is False
            assert heartbeat.version
            assert heartbeat.started_at_ms > 0
            await worker.wait_for_line("registered in etcd as " + key_of(worker))
            lease_lines = [line for line in worker.log if "registered in etcd" in line]
            assert "TTL 10 s" in lease_lines[0]
            lease = re.search(r"\(lease ([0-9a-f]+), TTL", lease_lines[0])
            assert lease is not None, lease_lines[0]
            # That lease is live in etcd, counting down from 10 s (expiry is the SIGKILL test).
            assert 0 < await client.lease_ttl_s(int(lease.group(1), 16)) <= 10


async def test_the_heartbeat_tracks_slot_use(tmp_path: Path) -> None:
    with trio.fail_after(FAIL_AFTER_S):
        async with (
            etcd_server(tmp_path / "etcd") as etcd,
            etcd_client(etcd) as client,
            serve_process("--slots", "3", "--executors", "1", env=worker_env(etcd)) as worker,
        ):
            await heartbeat_at(client, key_of(worker))
            request = pb.RequestTaskSlotRequest(task_id="reserved", ttl_ms=60_000)
            await worker.call(worker.stub.request_task_slot, request)

            reserved = await heartbeat_at(client, key_of(worker), lambda h: h.reserved_slots == 1)
            assert (reserved.free_slots, reserved.running_tasks) == (2, 0)

            await worker.call(worker.stub.submit_task, pb.SubmitTaskRequest(task=sleeper("t1")))
            running = await heartbeat_at(client, key_of(worker), lambda h: h.running_tasks == 1)
            assert (running.reserved_slots, running.free_slots) == (1, 1)


async def test_registration_resumes_after_etcd_restarts(tmp_path: Path) -> None:
    with trio.fail_after(FAIL_AFTER_S):
        async with (
            etcd_server(tmp_path / "etcd") as etcd,
            serve_process("--executors", "1", env=worker_env(etcd)) as worker,
        ):
            async with etcd_client(etcd) as client:
                await heartbeat_at(client, key_of(worker))

            await etcd.stop()
            await worker.wait_for_line("cannot register " + key_of(worker))
            status = await worker.call(worker.stub.get_worker_status, pb.GetWorkerStatusRequest())
            assert status.ready  # type: ignore[attr-defined]
            await etcd.start()  # same data dir and ports

            async with etcd_client(etcd) as client:
                restarted_at = (await client.get_prefix("/")).revision
                await heartbeat_at(client, key_of(worker), written_after=restarted_at)
            await worker.wait_for_line("registered again in etcd as " + key_of(worker))
            warnings = [line for line in worker.log if "cannot register" in line]
            assert len(warnings) == 1, warnings  # once per outage, however many retries


async def test_a_killed_workers_key_is_gone_within_its_lease_ttl(tmp_path: Path) -> None:
    with trio.fail_after(FAIL_AFTER_S):
        async with (
            etcd_server(tmp_path / "etcd") as etcd,
            etcd_client(etcd) as client,
            serve_process(
                "--executors", "1", env=worker_env(etcd, ETCD_LEASE_TTL_MS=str(SHORT_TTL_MS))
            ) as worker,
        ):
            await heartbeat_at(client, key_of(worker))
            worker.process.send_signal(signal.SIGKILL)
            await worker.process.wait()
            killed_at = trio.current_time()

            with trio.fail_after(SHORT_TTL_MS / 1000 + EXPIRY_SLACK_S):
                await key_deleted(client, key_of(worker))
            assert trio.current_time() - killed_at <= SHORT_TTL_MS / 1000 + EXPIRY_SLACK_S


async def test_a_drain_stops_admitting_then_deregisters_then_waits(
    tmp_path: Path,
) -> None:
    with trio.fail_after(FAIL_AFTER_S):
        async with (
            etcd_server(tmp_path / "etcd") as etcd,
            etcd_client(etcd) as client,
            serve_process(
                "--executors", "1", env=worker_env(etcd, DRAIN_TIMEOUT_MS="60000")
            ) as worker,
        ):
            await worker.call(worker.stub.submit_task, pb.SubmitTaskRequest(task=sleeper("stuck")))
            await heartbeat_at(client, key_of(worker), lambda h: h.running_tasks == 1)

            worker.process.send_signal(signal.SIGTERM)
            await key_deleted(client, key_of(worker))

            # Admission stopped first, then the key went, then the wait for live tasks
            # began; the worker still answers meanwhile.
            await worker.wait_for_line("draining: waiting")
            status = await worker.call(worker.stub.get_worker_status, pb.GetWorkerStatusRequest())
            assert status.draining  # type: ignore[attr-defined]
            assert status.running_tasks == 1  # type: ignore[attr-defined]
            assert worker.process.returncode is None
            order = [
                index
                for text in (
                    "draining: admitting no new tasks",
                    "deregistered " + key_of(worker),
                    "draining: waiting",
                )
                for index, line in enumerate(worker.log)
                if text in line
            ]
            assert len(order) == 3, worker.log
            assert order == sorted(order), worker.log
            assert not any("worker stopped" in line for line in worker.log)


async def test_placement_spreads_tasks_by_free_slots(tmp_path: Path) -> None:
    with trio.fail_after(FAIL_AFTER_S):
        async with (
            etcd_server(tmp_path / "etcd") as etcd,
            serve_process("--slots", "3", "--executors", "1", env=worker_env(etcd)) as big,
            serve_process("--slots", "2", "--executors", "1", env=worker_env(etcd)) as small,
            PlacementClient.connect(etcd.endpoint, PREFIX) as placement,
        ):
            await placement.wait_for(lambda workers: len(workers) == 2)
            big_addr, small_addr = f"127.0.0.1:{big.port}", f"127.0.0.1:{small.port}"
            running = {big_addr: 0, small_addr: 0}

            placed = []
            for index in range(5):
                worker_addr = (await placement.place(sleeper(f"t{index}"))).worker_addr
                placed.append(worker_addr)
                running[worker_addr] += 1
                # Each choice is made on a view that shows the previous ones.
                await placement.wait_for(
                    lambda workers: {w.address: w.running_tasks for w in workers} == running
                )

            # Most free first; on a tie, the worker running fewer tasks.
            assert placed == [big_addr, small_addr, big_addr, small_addr, big_addr]
            with pytest.raises(NoWorkerAvailable) as caught:
                await placement.place(sleeper("t5"))
            assert "none of the 2 registered workers has a free slot" in str(caught.value)


async def test_a_placement_is_heard_back_though_its_task_ended_before_the_worker_looked(
    tmp_path: Path,
) -> None:
    quick = pb.TaskSpec(
        task_id="quick",
        function_call=pb.FunctionCallConfig(type="call_list"),
        payload=json.dumps({"calls": [{"function": "demo.add", "args": [1, 2]}]}).encode(),
    )
    with trio.fail_after(FAIL_AFTER_S):
        async with (
            etcd_server(tmp_path / "etcd") as etcd,
            serve_process("--slots", "1", "--executors", "1", env=worker_env(etcd)) as worker,
            PlacementClient.connect(etcd.endpoint, PREFIX) as placement,
        ):
            address = f"127.0.0.1:{worker.port}"
            await placement.wait_for(lambda workers: len(workers) == 1)
            _, result = await placement.run_task(quick)
            assert result.state == pb.TaskState.SUCCEEDED, result.message

            # Idle again, as before the placement, yet a heartbeat is put: the placement
            # no longer counts against the worker's one slot, and the next one goes there.
            idle_again = await placement.wait_for(
                lambda workers: (workers[0].slots_granted, workers[0].free_slots) == (1, 1)
            )
            assert idle_again[0].address == address
            assert placement.directory.free_slots(address) == 1
            placed = await placement.place(sleeper("next"))
            assert placed.worker_addr == address


async def test_placement_routes_around_a_draining_worker(tmp_path: Path) -> None:
    with trio.fail_after(FAIL_AFTER_S):
        async with (
            etcd_server(tmp_path / "etcd") as etcd,
            serve_process(
                "--slots", "4", "--executors", "1",
                env=worker_env(etcd, DRAIN_TIMEOUT_MS="60000"),
            ) as draining,
            serve_process("--slots", "2", "--executors", "1", env=worker_env(etcd)) as other,
            PlacementClient.connect(etcd.endpoint, PREFIX) as placement,
        ):  # fmt: skip
            draining_addr, other_addr = f"127.0.0.1:{draining.port}", f"127.0.0.1:{other.port}"
            async with WorkerClient.connect(draining_addr) as direct:
                await direct.submit(sleeper("stuck"))
            # The view shows the draining-to-be worker as the better choice: 3 free against 2.
            await placement.wait_for(
                lambda workers: any(
                    w.address == draining_addr and w.running_tasks == 1 for w in workers
                )
            )
            assert placement.directory.placement_order()[0].address == draining_addr

            draining.process.send_signal(signal.SIGTERM)
            await draining.wait_for_line("draining: waiting")
            placed = [(await placement.place(sleeper(f"t{i}"))).worker_addr for i in range(2)]

            assert placed == [other_addr, other_addr]
            await placement.wait_for(lambda workers: [w.address for w in workers] == [other_addr])
            async with WorkerClient.connect(draining_addr) as direct:
                status = await direct.status()
            assert (status.draining, status.running_tasks) == (True, 1)


async def test_the_cli_lists_the_fleet_and_submits_through_placement(tmp_path: Path) -> None:
    with trio.fail_after(FAIL_AFTER_S):
        async with (
            etcd_server(tmp_path / "etcd") as etcd,
            etcd_client(etcd) as client,
            serve_process("--slots", "2", "--executors", "1", env=worker_env(etcd)) as worker,
        ):
            await heartbeat_at(client, key_of(worker))
            worker_addr = f"127.0.0.1:{worker.port}"
            blockx = [sys.executable, "-m", "blockx"]

            listed = await trio.run_process(
                [*blockx, "workers", "--etcd", etcd.endpoint], capture_stdout=True, cwd=REPO
            )
            header, row = listed.stdout.decode().splitlines()
            assert header.split() == [
                "ADDRESS", "DEPLOYMENT", "FREE/TOTAL", "RESERVED", "RUNNING", "EXECUTORS",
                "DRAINING", "VERSION", "STARTED",
            ]  # fmt: skip
            assert row.split()[:7] == [worker_addr, "block", "2/2", "0", "0", "1", "no"]
            as_json = await trio.run_process(
                [*blockx, "workers", "--etcd", etcd.endpoint, "--json"],
                capture_stdout=True,
                cwd=REPO,
            )
            assert [w["address"] for w in json.loads(as_json.stdout)] == [worker_addr]

            submit = [
                *blockx, "submit", "--etcd", etcd.endpoint, "--task-id", "cli-1",
                "--builder", "call_list",
                "--payload", json.dumps({"calls": [{"function": "demo.add", "args": [20, 22]}]}),
                "--watch",
            ]  # fmt: skip
            done = await trio.run_process(
                submit, capture_stdout=True, capture_stderr=True, cwd=REPO
            )
            assert json.loads(done.stdout)["state"] == "TASK_STATE_SUCCEEDED"
            assert f"task cli-1 placed on {worker_addr}" in done.stderr.decode()

            nowhere = [*submit[:6], "--prefix", "/nowhere/", *submit[6:]]
            refused = await trio.run_process(
                nowhere, capture_stdout=True, capture_stderr=True, cwd=REPO, check=False
            )
            assert refused.returncode == 1
            assert refused.stderr.decode() == (
                "blockx: error: cannot place task cli-1 under '/nowhere/': "
                "no worker is registered there\n"
            )
