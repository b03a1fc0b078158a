"""A real `python -m blockx hub` process for e2e tests, reached over loopback TCP: in plain
text, or over TLS when it is given certificates (`tests.adapters.certificates.Pki`)."""

from __future__ import annotations

import os
import signal
import ssl
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import attrs
import trio

from blockx.hub import Right, Store, create_credential, create_queue
from tests.adapters.certificates import Pki
from tests.adapters.hub_harness import HubEndpoint
from tests.e2e.serve_process import REPO, START_TIMEOUT_S, free_port

READY_LINE = "listening on"


def queue_with_credential(db: str, queue_id: str) -> str:
    """Queue `queue_id` on the hub database `db` (a path or URL), and a token that may
    produce and work on it."""
    store = Store(db)
    try:
        create_queue(store, queue_id, 0)
        return create_credential(store, queue_id, frozenset({Right.PRODUCER, Right.WORKER}), 0)
    finally:
        store.close()


@attrs.define(eq=False)
class HubProcess(HubEndpoint):
    process: trio.Process | None = None
    port: int = 0
    tls: ssl.SSLContext | None = None
    """How this test's clients reach the hub over TLS; None in plain text."""
    log: list[str] = attrs.Factory(list)
    logged: trio.Event = attrs.Factory(trio.Event)
    """Replaced by a fresh event, after being set, whenever a line is logged."""

    async def wait_for_line(self, text: str) -> int:
        """Until the hub has logged a line containing `text`; that line's index."""
        while True:
            for index, line in enumerate(self.log):
                if text in line:
                    return index
            await self.logged.wait()

    async def open_stream(self) -> trio.abc.Stream:
        if self.tls is None:
            return await trio.open_tcp_stream("127.0.0.1", self.port)
        return await trio.open_ssl_over_tcp_stream(
            "127.0.0.1", self.port, ssl_context=self.tls, https_compatible=True
        )

    async def kill(self) -> None:
        """SIGKILL: the hub gets no chance to finish anything."""
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        await self.process.wait()
        assert self.process.returncode == -signal.SIGKILL


async def _pump(stream: trio.abc.ReceiveStream, hub: HubProcess, ready: trio.Event) -> None:
    buffer = b""
    async for chunk in stream:
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            hub.log.append(line.decode(errors="replace"))
            if READY_LINE.encode() in line:
                ready.set()
        hub.logged.set()
        hub.logged = trio.Event()


@asynccontextmanager
async def hub_process(
    db: str, env: dict[str, str] | None = None, tls: Pki | None = None, port: int = 0
) -> AsyncIterator[HubProcess]:
    """A hub on `db` and loopback `port` (0: a free one; a hub started again takes the port
    of the one it replaces, so that its workers find it), serving HTTPS and WSS with `tls`'s
    certificate if given; yields once it listens, kills it on exit."""
    port = port or free_port()
    command = [sys.executable, "-m", "blockx", "hub", "--listen", f"127.0.0.1:{port}", "--db", db]
    environment = {k: v for k, v in os.environ.items() if not k.startswith("HUB_")}
    environment.update(env or {})
    if tls is not None:
        environment.update(tls.hub_env())
    async with trio.open_nursery() as nursery:
        process = await trio.lowlevel.open_process(
            command, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, env=environment, cwd=REPO
        )
        assert process.stderr is not None
        context = None if tls is None else tls.hub_client_context()
        hub = HubProcess(nursery=nursery, process=process, port=port, tls=context)
        ready = trio.Event()
        nursery.start_soon(_pump, process.stderr, hub, ready)
        with trio.move_on_after(START_TIMEOUT_S):
            await ready.wait()
        if not ready.is_set():
            process.kill()
            raise AssertionError("the hub did not start:\n" + "\n".join(hub.log))
        served = hub.log[await hub.wait_for_line(READY_LINE)]
        assert ("(https and wss)" in served) == (tls is not None), served
        try:
            yield hub
        finally:
            if process.returncode is None:
                process.kill()
            with trio.CancelScope(shield=True):
                await process.wait()
            nursery.cancel_scope.cancel()
