"""A real hub process follows the signal rule of every blockx server: the first SIGINT or
SIGTERM drains it, a second exits at once, and the same signal again within a second (a
process manager signalling the whole group) counts once."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
from pathlib import Path

import trio

from blockx.hub import Right, Store, create_credential, create_queue
from tests.adapters.hub_harness import QUEUE, assert_told_to_go
from tests.e2e.hub_process import HubProcess, hub_process

LOG = {"LOG_FORMAT": "text"}


def credential(db: Path) -> str:
    store = Store(str(db))
    try:
        create_queue(store, QUEUE, 0)
        return create_credential(store, QUEUE, frozenset({Right.WORKER, Right.PRODUCER}), 0)
    finally:
        store.close()


async def hold_a_request(hub: HubProcess) -> trio.abc.Stream:
    """A producer's request the hub has begun and cannot end: its body never comes.

    Begun: its head is in the hub's socket before another request is even made, and the
    hub has answered that one; so the hub has read the head (loopback delivers at once,
    and Trio runs every ready task before any of them runs again)."""
    stream = await trio.open_tcp_stream("127.0.0.1", hub.port)
    head = f"POST /v1/queues/{QUEUE}/tasks HTTP/1.1\r\nhost: h\r\ncontent-length: 9\r\n\r\n"
    await stream.send_all(head.encode())
    async with await trio.open_tcp_stream("127.0.0.1", hub.port) as other:
        await other.send_all(b"GET /v1/tasks/none HTTP/1.1\r\nhost: h\r\nconnection: close\r\n\r\n")
        while await other.receive_some():
            pass
    return stream


async def test_the_first_signal_drains_the_hub_and_tells_its_workers_to_go(
    tmp_path: Path,
) -> None:
    db = tmp_path / "hub.sqlite3"
    token = credential(db)
    async with hub_process(str(db), LOG) as hub, hub.worker(token) as worker:
        assert hub.process is not None
        with trio.fail_after(30):
            hub.process.send_signal(signal.SIGTERM)
            error = await worker.closed()
            code = await hub.process.wait()
        assert_told_to_go(worker, error)
        assert code == 0, "\n".join(hub.log)
        assert any("SIGTERM: draining the hub" in line for line in hub.log), hub.log
        assert any("stopped" in line for line in hub.log), hub.log
        assert not any("exiting at once" in line for line in hub.log), hub.log


async def test_a_second_signal_exits_the_hub_at_once(tmp_path: Path) -> None:
    db = tmp_path / "hub.sqlite3"
    credential(db)
    async with hub_process(str(db), {**LOG, "HUB_DRAIN_TIMEOUT_MS": "60000"}) as hub:
        assert hub.process is not None
        held = await hold_a_request(hub)
        with trio.fail_after(30):
            hub.process.send_signal(signal.SIGTERM)
            await hub.wait_for_line("draining the hub")
            # Another signal than the first: a second request, however soon it comes.
            hub.process.send_signal(signal.SIGINT)
            code = await hub.process.wait()
        await held.aclose()
        assert code == 128 + signal.SIGINT
        assert any("exiting at once" in line for line in hub.log), hub.log


async def test_the_same_signal_twice_at_once_is_one_request(tmp_path: Path) -> None:
    db = tmp_path / "hub.sqlite3"
    credential(db)
    async with hub_process(str(db), {**LOG, "HUB_DRAIN_TIMEOUT_MS": "1500"}) as hub:
        assert hub.process is not None
        held = await hold_a_request(hub)
        with trio.fail_after(30):
            hub.process.send_signal(signal.SIGTERM)
            hub.process.send_signal(signal.SIGTERM)
            code = await hub.process.wait()
        await held.aclose()
        assert code == 0, "\n".join(hub.log)
        assert sum("draining the hub" in line for line in hub.log) == 1, hub.log
        assert any("drain timeout passed" in line for line in hub.log), hub.log
        assert not any("exiting at once" in line for line in hub.log), hub.log


def test_a_busy_port_stops_the_hub_at_once_in_one_line(tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = int(holder.getsockname()[1])
        command = [sys.executable, "-m", "blockx", "hub", "--db", str(tmp_path / "hub.db")]
        done = subprocess.run(
            [*command, "--listen", f"127.0.0.1:{port}"],
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1:] == [
        f"blockx: cannot listen on 127.0.0.1:{port}: address already in use"
    ]
    assert "Traceback" not in done.stderr
