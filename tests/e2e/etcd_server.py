"""A real etcd (Debian's `etcd-server`, v3.4) for e2e tests.

`etcd_server(data_dir)` starts one member on loopback with free ports and fast
raft timing, waits until `GET /health` says healthy, and stops it on exit.
`EtcdServer.stop()` and `start()` stop and restart the same member on the
same ports and data directory (what a test of an etcd outage needs).
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import IO

import attrs
import trio

from tests.e2e.serve_process import free_port

START_TIMEOUT_S = 20
STOP_GRACE_S = 5
HEALTH_POLL_S = 0.05
"""The one place e2e tests sleep for real: polling a starting server's /health."""

ETCD = shutil.which("etcd") or "/usr/bin/etcd"
"""A missing etcd fails the tests that need it, never skips them: CI installs it."""


@attrs.define
class EtcdServer:
    data_dir: Path
    client_port: int
    peer_port: int
    log_path: Path
    process: trio.Process | None = None
    _log_file: IO[bytes] | None = None

    @property
    def endpoint(self) -> str:
        """host:port of the client API, as `etcdEndpoints` takes it."""
        return f"127.0.0.1:{self.client_port}"

    def command(self) -> list[str]:
        client = f"http://127.0.0.1:{self.client_port}"
        peer = f"http://127.0.0.1:{self.peer_port}"
        return [
            ETCD,
            "--name=t0",
            f"--data-dir={self.data_dir}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=t0={peer}",
            "--initial-cluster-state=new",
            "--heartbeat-interval=10",
            "--election-timeout=100",
        ]

    async def start(self) -> None:
        """Start the member and return once it reports itself healthy."""
        assert self.process is None, "etcd already runs"
        self._log_file = self.log_path.open("ab")
        self.process = await trio.lowlevel.open_process(
            self.command(), stdout=subprocess.DEVNULL, stderr=self._log_file
        )
        with trio.move_on_after(START_TIMEOUT_S):
            while not await self._healthy():
                if self.process.returncode is not None:
                    break
                await trio.sleep(HEALTH_POLL_S)
            else:
                return
        await self.stop()
        raise AssertionError("etcd did not get healthy:\n" + self.log_path.read_text()[-4000:])

    async def stop(self) -> None:
        """SIGTERM, then SIGKILL after a grace period; waits for the exit."""
        process, self.process = self.process, None
        if process is not None:
            with trio.CancelScope(shield=True):
                if process.returncode is None:
                    process.send_signal(signal.SIGTERM)
                with trio.move_on_after(STOP_GRACE_S):
                    await process.wait()
                if process.returncode is None:
                    process.kill()
                    await process.wait()
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    async def _healthy(self) -> bool:
        try:
            stream = await trio.open_tcp_stream("127.0.0.1", self.client_port)
        except OSError:
            return False
        async with stream:
            request = f"GET /health HTTP/1.0\r\nHost: 127.0.0.1:{self.client_port}\r\n\r\n"
            try:
                await stream.send_all(request.encode())
                reply = b""
                while chunk := await stream.receive_some():
                    reply += chunk
            except trio.BrokenResourceError:
                return False
        _, _, body = reply.partition(b"\r\n\r\n")
        try:
            return bool(json.loads(body).get("health") == "true")
        except ValueError:
            return False


@asynccontextmanager
async def etcd_server(data_dir: Path) -> AsyncIterator[EtcdServer]:
    """One healthy etcd member with its data in `data_dir`; stopped on exit."""
    data_dir.mkdir(parents=True, exist_ok=True)
    client_port = free_port()
    peer_port = free_port()
    while peer_port == client_port:
        peer_port = free_port()
    server = EtcdServer(
        data_dir=data_dir / "member-data",
        client_port=client_port,
        peer_port=peer_port,
        log_path=data_dir / "etcd.log",
    )
    await server.start()
    try:
        yield server
    finally:
        await server.stop()
