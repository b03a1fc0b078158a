"""The registrar on a virtual clock: what it puts and when, and when etcd cannot be reached.

Which heartbeats reach etcd is shown against a stand-in etcd (`FakeEtcd`, the
registrar's `connect`) under Trio's autojump clock, at exact virtual times.
Unreachable etcd: the endpoint is a loopback port nobody listens on, so every
attempt is refused at once. (With etcd running, registration is covered end to
end in tests/e2e/test_etcd.py.) Every test runs under `fail_after`.
"""

from __future__ import annotations

import contextlib
import logging
import socket
from collections.abc import AsyncIterator

import attrs
import pytest
import trio
import trio_asyncio
from grpclib.const import Status

from blockx._proto.blockx.worker import v1 as pb
from blockx.discovery import InvalidEtcdEndpoint, Lease, LeaseNotFound, Registrar, WorkerHeartbeat
from tests.adapters.worker_harness import running_worker, worker_config

FAIL_AFTER_S = 10
RETRY_SPAN_S = 60
"""Virtual time the registrar retries for: many back-off rounds."""
KEY = "/blockx/workers/127.0.0.1:1"
INTERVAL_MS = 250
REFRESH_MS = 10_000
INTERVAL_S = INTERVAL_MS / 1000
REFRESH_S = REFRESH_MS / 1000
"""Binary fractions of a second, so that the registrar's looks fall on exact virtual times."""
LEASE_TTL_S = 9
"""Renewed every 3 s."""
VIRTUAL_FAIL_AFTER_S = 100
"""`fail_after` of the tests on the virtual clock, which span tens of virtual seconds."""


def free_port() -> int:
    """A loopback port nobody listens on (bound, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def heartbeat() -> WorkerHeartbeat:
    return WorkerHeartbeat(
        address="127.0.0.1:1",
        deployment="block",
        slots_total=1,
        reserved_slots=0,
        running_tasks=0,
        free_slots=1,
        executors_healthy=1,
        draining=False,
        version="0",
        started_at_ms=0,
    )


@attrs.define
class Capacity:
    """A worker's heartbeat that a test changes: `reserved` of its many slots."""

    reserved: int = 0
    reads: int = 0

    async def heartbeat(self) -> WorkerHeartbeat:
        self.reads += 1
        return attrs.evolve(
            await heartbeat(),
            slots_total=1_000_000,
            reserved_slots=self.reserved,
            free_slots=1_000_000 - self.reserved,
        )


@attrs.frozen(kw_only=True)
class Put:
    at_s: float
    reserved: int
    lease_id: int


@attrs.define
class FakeEtcd:
    """etcd as the registrar uses it, on the virtual clock: one key, leases that live
    until `expire()`, and a record of every put. Every call answers at once."""

    started_s: float = attrs.field(factory=trio.current_time)
    puts: list[Put] = attrs.field(factory=list)
    live_lease: int | None = None
    leases_granted: int = 0

    @contextlib.asynccontextmanager
    async def connect(self) -> AsyncIterator[FakeEtcd]:
        yield self

    async def put(self, key: str, value: bytes, *, lease_id: int = 0) -> int:
        assert key == KEY
        if lease_id != self.live_lease:
            raise LeaseNotFound(rpc="Put", status=Status.NOT_FOUND, message="lease not found")
        reserved = WorkerHeartbeat.from_json(value).reserved_slots
        self.puts.append(Put(at_s=self.now_s(), reserved=reserved, lease_id=lease_id))
        return len(self.puts)

    async def delete(self, key: str) -> int:
        return 1

    async def grant_lease(self, ttl_s: int) -> Lease:
        self.leases_granted += 1
        self.live_lease = self.leases_granted
        return Lease(lease_id=self.live_lease, ttl_s=ttl_s)

    async def revoke_lease(self, lease_id: int) -> None:
        self.live_lease = None

    @contextlib.asynccontextmanager
    async def keep_alive(self) -> AsyncIterator[FakeEtcd]:
        yield self

    async def renew(self, lease_id: int) -> int:
        return LEASE_TTL_S if lease_id == self.live_lease else 0

    def expire(self) -> None:
        self.live_lease = None

    def now_s(self) -> float:
        """Virtual seconds since the fake was made (the registrar's start)."""
        return trio.current_time() - self.started_s

    def put_times(self) -> list[float]:
        return [put.at_s for put in self.puts]


def fake_registrar(etcd: FakeEtcd, capacity: Capacity) -> Registrar:
    return Registrar(
        endpoints=["127.0.0.1:2379"],
        key=KEY,
        lease_ttl_ms=LEASE_TTL_S * 1000,
        heartbeat_interval_ms=INTERVAL_MS,
        heartbeat_refresh_ms=REFRESH_MS,
        heartbeat=capacity.heartbeat,
        connect=etcd.connect,
    )


async def sleep_until_s(etcd: FakeEtcd, at_s: float) -> None:
    """Until `at_s` after the start. Never at a look's time (a multiple of the interval):
    which of two tasks due at once runs first is Trio's choice."""
    assert at_s % INTERVAL_S, at_s
    await trio.sleep_until(etcd.started_s + at_s)


async def test_an_idle_registrar_puts_once_at_start_then_once_per_refresh(
    autojump_clock: trio.testing.MockClock,
) -> None:
    etcd, capacity = FakeEtcd(), Capacity()
    registrar = fake_registrar(etcd, capacity)
    with trio.fail_after(VIRTUAL_FAIL_AFTER_S):
        async with trio.open_nursery() as nursery:
            await nursery.start(registrar.run)
            await sleep_until_s(etcd, 3 * REFRESH_S + 5.1)
            await registrar.deregister()

    assert etcd.put_times() == [0, REFRESH_S, 2 * REFRESH_S, 3 * REFRESH_S]
    assert registrar.puts == 4
    # It still looked every interval: an unchanged heartbeat is read, compared and dropped.
    assert capacity.reads == 1 + (3 * REFRESH_S + 5) / INTERVAL_S  # at 0 s, then each look
    assert etcd.live_lease is None  # deregistered


async def test_a_change_is_put_at_the_next_look_and_the_refresh_counts_from_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    etcd, capacity = FakeEtcd(), Capacity()
    registrar = fake_registrar(etcd, capacity)
    with trio.fail_after(VIRTUAL_FAIL_AFTER_S):
        async with trio.open_nursery() as nursery:
            await nursery.start(registrar.run)
            await sleep_until_s(etcd, 3.1)
            capacity.reserved = 1
            await sleep_until_s(etcd, 3.25 + REFRESH_S + 1.1)
            await registrar.deregister()

    assert etcd.put_times() == [0, 3.25, 3.25 + REFRESH_S]
    assert [put.reserved for put in etcd.puts] == [0, 1, 1]


async def test_a_heartbeat_that_keeps_changing_is_put_once_per_interval(
    autojump_clock: trio.testing.MockClock,
) -> None:
    etcd, capacity = FakeEtcd(), Capacity()
    registrar = fake_registrar(etcd, capacity)
    changes_per_interval = 127
    intervals = 8

    async def keep_changing() -> None:
        for interval in range(intervals):
            for step in range(1, changes_per_interval + 1):
                await sleep_until_s(etcd, interval * INTERVAL_S + step / 512)
                capacity.reserved += 1

    with trio.fail_after(VIRTUAL_FAIL_AFTER_S):
        async with trio.open_nursery() as nursery:
            await nursery.start(registrar.run)
            await keep_changing()
            await sleep_until_s(etcd, REFRESH_S - 0.9)
            await registrar.deregister()

    # One put per look while it changed (each with what it was at that look), then quiet.
    looks = [interval * INTERVAL_S for interval in range(intervals + 1)]
    assert etcd.put_times() == looks
    assert [put.reserved for put in etcd.puts] == [
        interval * changes_per_interval for interval in range(intervals + 1)
    ]
    assert registrar.puts == intervals + 1


async def test_a_new_lease_is_put_at_once_though_the_heartbeat_did_not_change(
    autojump_clock: trio.testing.MockClock,
) -> None:
    etcd, capacity = FakeEtcd(), Capacity()
    registrar = fake_registrar(etcd, capacity)
    with trio.fail_after(VIRTUAL_FAIL_AFTER_S):
        async with trio.open_nursery() as nursery:
            await nursery.start(registrar.run)
            await sleep_until_s(etcd, 4.1)
            etcd.expire()  # the renewal at 6 s finds it gone
            await sleep_until_s(etcd, 6 + REFRESH_S - 0.9)
            await registrar.deregister()

    assert etcd.put_times() == [0, 6]
    assert [put.lease_id for put in etcd.puts] == [1, 2]
    assert registrar.puts == 2


class WarningSeen(logging.Handler):
    """Sets `seen` at the first WARNING of `blockx.discovery` (logged on the Trio thread)."""

    def __init__(self) -> None:
        super().__init__(level=logging.WARNING)
        self.seen = trio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        self.seen.set()


def discovery_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        record.getMessage()
        for record in caplog.records
        if record.name == "blockx.discovery" and record.levelno >= logging.WARNING
    ]


async def test_an_unreachable_etcd_is_retried_with_one_warning_per_outage(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    endpoint = f"127.0.0.1:{free_port()}"
    registrar = Registrar(
        endpoints=[endpoint],
        key=KEY,
        lease_ttl_ms=10_000,
        heartbeat_interval_ms=200,
        heartbeat_refresh_ms=10_000,
        heartbeat=heartbeat,
    )
    with trio.fail_after(RETRY_SPAN_S * 2):
        async with trio_asyncio.open_loop(), trio.open_nursery() as nursery:
            await nursery.start(registrar.run)
            await trio.sleep(RETRY_SPAN_S)
            deregister_started = trio.current_time()
            await registrar.deregister()

            assert trio.current_time() - deregister_started < 1  # nothing was registered
            nursery.cancel_scope.cancel()

    warnings = discovery_warnings(caplog)
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith("cannot register /blockx/workers/127.0.0.1:1 in etcd (")
    assert endpoint in warnings[0]
    assert registrar.lease_id is None


async def test_a_bad_endpoint_is_refused_when_the_registrar_is_made() -> None:
    with pytest.raises(InvalidEtcdEndpoint, match="must be HOST:PORT"):
        Registrar(
            endpoints=["no-port"],
            key="/k",
            lease_ttl_ms=1_000,
            heartbeat_interval_ms=200,
            heartbeat_refresh_ms=10_000,
            heartbeat=heartbeat,
        )


async def test_without_etcd_the_worker_serves_and_stops_normally(
    caplog: pytest.LogCaptureFixture,
) -> None:
    seen = WarningSeen()
    logging.getLogger("blockx.discovery").addHandler(seen)
    try:
        config = worker_config(etcdEndpoints=f"127.0.0.1:{free_port()}")
        with trio.fail_after(FAIL_AFTER_S):
            async with running_worker(config) as worker:
                await seen.seen.wait()
                slot = await worker.call(
                    worker.stub.request_task_slot, pb.RequestTaskSlotRequest(task_id="t1")
                )
                assert slot.slot_id
    finally:
        logging.getLogger("blockx.discovery").removeHandler(seen)

    assert len(discovery_warnings(caplog)) == 1
