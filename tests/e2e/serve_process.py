"""A real `python -m blockx serve` process for e2e tests, and a client to talk to it."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import attrs
import trio
import trio_asyncio
from grpclib.client import Channel

from blockx._proto.blockx.worker import v1 as pb

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples" / "functions"
READY_LINE = "worker ready on"
START_TIMEOUT_S = 60


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@attrs.define
class ServeProcess:
    process: trio.Process
    port: int
    log: list[str]
    stub: pb.WorkerServiceStub
    channel: Channel
    logged: trio.Event
    """Replaced by a fresh event, after being set, whenever a line is logged."""

    async def wait_for_line(self, text: str, start: int = 0) -> int:
        """Until the worker has logged a line containing `text` (from line `start` on);
        that line's index."""
        while True:
            for index in range(start, len(self.log)):
                if text in self.log[index]:
                    return index
            await self.logged.wait()

    async def call(self, method: object, request: object) -> object:
        return await trio_asyncio.aio_as_trio(method)(request)

    async def watch(
        self, *task_ids: str, attached: trio.Event | None = None
    ) -> list[pb.TaskUpdate]:
        """Every update until all `task_ids` ended; `attached` is set at the first one."""
        stream = self.stub.watch_tasks(pb.WatchTasksRequest(task_ids=list(task_ids)))
        updates = []
        async for update in trio_asyncio.aio_as_trio(stream):
            updates.append(update)
            if attached is not None:
                attached.set()
        return updates


async def _pump(stream: trio.abc.ReceiveStream, worker: ServeProcess, ready: trio.Event) -> None:
    buffer = b""
    async for chunk in stream:
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            text = line.decode(errors="replace")
            worker.log.append(text)
            if READY_LINE in text:
                ready.set()
        worker.logged.set()
        worker.logged = trio.Event()


def runtime_dir_config(tmp_path: Path) -> tuple[Path, Path]:
    """A WORKER_CONFIG file that puts the executors' runtime directory under
    `tmp_path/run`, and that directory: (config file, runtime parent)."""
    runtime_parent = tmp_path / "run"
    runtime_parent.mkdir(exist_ok=True)
    config = tmp_path / "worker.json"
    config.write_text(json.dumps({"executorRuntimeDir": str(runtime_parent)}))
    return config, runtime_parent


def uv_executable() -> str:
    """The `uv` that runs this test suite (`uv run pytest`); a missing one fails the test."""
    found = os.environ.get("UV") or shutil.which("uv")
    assert found, "uv is not on PATH; the README's commands install it"
    return found


@asynccontextmanager
async def serve_process(
    *args: str, env: dict[str, str] | None = None, under_uv: bool = False
) -> AsyncIterator[ServeProcess]:
    """Start a worker on a free loopback port; yields once it logged that it is ready.

    `under_uv` starts it as a newcomer does, `uv run python -m blockx serve`, in a
    process group of its own (its id is `process.pid`), as a process manager would.
    On exit the process (group) is killed if it still runs (a test that stops it
    itself checks its exit status first).
    """
    port = free_port()
    python = [uv_executable(), "run", "--no-sync", "python"] if under_uv else [sys.executable]
    command = [
        *python,
        "-m",
        "blockx",
        "serve",
        "--listen",
        f"127.0.0.1:{port}",
        "--functions",
        str(EXAMPLES),
        *args,
    ]
    environment = {k: v for k, v in os.environ.items() if k != "WORKER_CONFIG"}
    environment["METRICS_LISTEN"] = "127.0.0.1:0"  # tests run many workers: not the fixed :9464
    environment["ETCD_ENDPOINTS"] = "none"  # a test that wants etcd names its own in `env`
    environment.update(env or {})
    log: list[str] = []
    ready = trio.Event()
    async with trio_asyncio.open_loop(), trio.open_nursery() as nursery:
        process = await trio.lowlevel.open_process(
            command,
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            env=environment,
            cwd=REPO,
            start_new_session=under_uv,
        )
        assert process.stderr is not None
        channel = await trio_asyncio.aio_as_trio(_channel)(port)
        worker = ServeProcess(
            process=process,
            port=port,
            log=log,
            stub=pb.WorkerServiceStub(channel),
            channel=channel,
            logged=trio.Event(),
        )
        nursery.start_soon(_pump, process.stderr, worker, ready)
        with trio.move_on_after(START_TIMEOUT_S):
            await ready.wait()
        if not ready.is_set():
            process.kill()
            raise AssertionError("worker did not get ready:\n" + "\n".join(log))
        try:
            yield worker
        finally:
            channel.close()
            if under_uv:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
            if process.returncode is None:
                process.kill()
            with trio.CancelScope(shield=True):
                await process.wait()
            nursery.cancel_scope.cancel()


async def _channel(port: int) -> Channel:
    return Channel("127.0.0.1", port)
