"""The registrar and the worker when etcd cannot be reached.

The etcd endpoint is a loopback port nobody listens on, so every attempt is
refused at once. (With etcd running, registration is covered end to end in
tests/e2e/test_etcd.py.) Every test runs under `fail_after`.
"""

from __future__ import annotations

import logging
import socket

import pytest
import trio
import trio_asyncio

from blockx._proto.blockx.worker import v1 as pb
from blockx.discovery import InvalidEtcdEndpoint, Registrar, WorkerHeartbeat
from tests.adapters.worker_harness import running_worker, worker_config

FAIL_AFTER_S = 10
RETRY_SPAN_S = 60
"""Virtual time the registrar retries for: many back-off rounds."""


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
        key="/blockx/workers/127.0.0.1:1",
        lease_ttl_ms=10_000,
        heartbeat_interval_ms=200,
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
