"""The worker's metrics port: `/metrics`, a live status page at `/` and its WebSocket `/ws`.

HTTP/1.1 is parsed by httptools and served on Trio, one request per connection
(every response says `Connection: close`): a scraper or a browser needs no
more. The page's stylesheet and chart code are the files `blockx.web` shares
with the hub, served under `/assets/`. `/ws` hands the connection, with the
bytes already read replayed, to trio-websocket, which pushes a JSON snapshot of
the worker every `PUSH_INTERVAL_S`, or sooner when slots, tasks or executors
change. A socket's first snapshot carries the whole task history (`HISTORY_S`
seconds, a few KB); each later one only the seconds closed since the one
before (usually one, or none).

Must never let one client's bad request, slowness or disconnect reach the
worker: every connection's errors end at its handler. Must never change
worker state: it only reads the `WorkerProbe` and the `WorkerMetrics`.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.resources
import json
import logging
import socket
from collections.abc import Callable
from typing import Any, Final

import attrs
import trio
import trio_websocket

from blockx.executors import ExecutorView
from blockx.net.http import (
    RESPONSE_TIMEOUT_S,
    Connection,
    Request,
    accept_websocket,
    header,
    is_websocket_upgrade,
    read_request_head,
    respond,
    serve_guarded,
)
from blockx.observability.history import HISTORY_S, STEP_MS, HistoryWindow
from blockx.observability.metrics import WorkerMetrics, WorkerProbe, WorkerSnapshot
from blockx.slots import TaskResult
from blockx.web import CACHE_CONTROL, asset

logger = logging.getLogger("blockx.status")

WEBSOCKET_PATH: Final = "/ws"
PUSH_INTERVAL_S: Final = 0.5
"""A snapshot goes out at least this often, changed or not."""
POLL_INTERVAL_S: Final = 0.1
"""How often the worker's state is compared with the last snapshot sent."""
MAX_WEBSOCKETS: Final = 32
"""Open status-page sockets beyond this are refused with 503."""
PAGE: Final = (
    importlib.resources.files("blockx.observability").joinpath("status_page.html").read_bytes()
)


@attrs.define
class StatusServer:
    """Serves one worker's metrics port. Start `run` with `nursery.start`; it returns the port."""

    metrics: WorkerMetrics
    probe: WorkerProbe
    hub: Callable[[], dict[str, Any]] | None = None
    """The node's hub session as plain JSON values, if it takes tasks from a hub: each
    message carries it as `hub`."""
    _websockets_open: int = attrs.field(default=0, init=False)

    async def run(
        self, sock: socket.socket, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Serve on the bound TCP socket `sock` (owned from now on) until cancelled;
        `started` with its port."""
        sock.listen()
        listener = trio.SocketListener(trio.socket.from_stdlib_socket(sock))
        task_status.started(int(sock.getsockname()[1]))
        await trio.serve_listeners(
            functools.partial(serve_guarded, serve=self._serve, logger=logger), [listener]
        )

    async def _serve(self, stream: trio.abc.HalfCloseableStream) -> None:
        connection = Connection()
        received = bytearray()
        request = await read_request_head(stream, connection, received)
        if request is None:
            return
        path = request.target.decode("ascii", "replace").partition("?")[0]
        if path == WEBSOCKET_PATH:
            await self._websocket(stream, connection, request, bytes(received))
            return
        with trio.move_on_after(RESPONSE_TIMEOUT_S):
            await self._respond_http(stream, connection, request, path)

    async def _respond_http(
        self,
        stream: trio.abc.HalfCloseableStream,
        connection: Connection,
        request: Request,
        path: str,
    ) -> None:
        if request.method not in (b"GET", b"HEAD"):
            await respond(stream, 405, "only GET and HEAD\n", extra=[("allow", "GET, HEAD")])
            return
        head = request.method == b"HEAD"
        if path == "/metrics":
            snapshot = await self.probe.snapshot()
            body, content_type = self.metrics.render(snapshot, header(request, b"accept"))
            await respond(stream, 200, body, content_type, head=head)
        elif path in ("/", "/index.html"):
            await respond(stream, 200, PAGE, "text/html; charset=utf-8", head=head)
        elif (shared := asset(path)) is not None:
            body, content_type = shared
            cache = [("cache-control", CACHE_CONTROL)]
            await respond(stream, 200, body, content_type, head=head, extra=cache)
        else:
            await respond(stream, 404, f"not found: {path}\n", head=head)

    async def _websocket(
        self,
        stream: trio.abc.HalfCloseableStream,
        connection: Connection,
        request: Request,
        received: bytes,
    ) -> None:
        if not is_websocket_upgrade(request):
            with trio.move_on_after(RESPONSE_TIMEOUT_S):
                await respond(
                    stream,
                    400,
                    f"{WEBSOCKET_PATH} takes a WebSocket upgrade (GET with Upgrade: websocket)\n",
                )
            return
        if self._websockets_open >= MAX_WEBSOCKETS:
            with trio.move_on_after(RESPONSE_TIMEOUT_S):
                await respond(stream, 503, "too many status-page sockets open\n")
            return
        self._websockets_open += 1
        try:
            await accept_websocket(stream, received, self._push_snapshots)
        finally:
            self._websockets_open -= 1

    async def _push_snapshots(self, socket: trio_websocket.WebSocketConnection) -> None:
        with contextlib.suppress(trio_websocket.ConnectionClosed):
            await self._push_changes(socket)

    async def _push_changes(self, socket: trio_websocket.WebSocketConnection) -> None:
        last_key: str | None = None
        last_sent_s = float("-inf")
        sequence = 0
        history_sent_ms: int | None = None  # where the history sent so far ends
        while True:
            snapshot = await self.probe.snapshot()
            message = snapshot_json(snapshot, self.metrics, history_since_ms=history_sent_ms)
            if self.hub is not None:
                message["hub"] = self.hub()
            key = _change_key(message)
            if key != last_key or trio.current_time() - last_sent_s >= PUSH_INTERVAL_S:
                sequence += 1
                message["sequence"] = sequence
                await socket.send_message(json.dumps(message, separators=(",", ":")))
                last_key, last_sent_s = key, trio.current_time()
                history_sent_ms = message["history"]["end_ms"]
            await trio.sleep(POLL_INTERVAL_S)


# ------------------------------------------------------------------ snapshot JSON


def snapshot_json(
    snapshot: WorkerSnapshot, metrics: WorkerMetrics, *, history_since_ms: int | None = None
) -> dict[str, Any]:
    """What one WebSocket message carries: the worker's state as plain JSON values, and
    its task history: all of it, or (`history_since_ms`) the seconds from there on."""
    identity = snapshot.identity
    return {
        "sequence": 0,
        "at_ms": snapshot.at_ms,
        "worker": {
            "worker_addr": identity.worker_addr,
            "deployment": identity.deployment,
            "version": identity.version,
            "started_at_ms": identity.started_at_ms,
        },
        "ready": snapshot.heartbeat.ready,
        "draining": snapshot.heartbeat.draining,
        "totals": _totals(snapshot, metrics),
        "slots": [
            {"slot_id": slot.slot_id, "state": slot.state.value, "task_id": slot.task_id}
            for slot in snapshot.slots
        ],
        "tasks": [
            {
                "task_id": task.task_id,
                "slot_id": task.slot_id,
                "state": task.state.value,
                "phase": task.phase.value if task.phase is not None else "RESERVED",
                "deadline_ms": task.deadline_ms,
            }
            for task in snapshot.tasks
        ],
        "recent": [_recent(result) for result in reversed(metrics.recent)],
        "executors": [_executor(view) for view in snapshot.executors],
        "history": _history(
            metrics.history.window(snapshot.at_ms, since_ms=history_since_ms),
            full=history_since_ms is None,
        ),
    }


def _totals(snapshot: WorkerSnapshot, metrics: WorkerMetrics) -> dict[str, int]:
    beat = snapshot.heartbeat
    return {
        "slots": beat.slots_total,
        "free_slots": beat.free_slots,
        "reserved_slots": beat.reserved_slots,
        "running_tasks": beat.running_tasks,
        "active_tasks": beat.active_tasks,
        "watch_streams": snapshot.watch_streams,
        "tasks_succeeded": metrics.finished_by_state["SUCCEEDED"],
        "tasks_failed": metrics.finished_by_state["FAILED"],
        "worker_rss_bytes": snapshot.worker_rss_bytes,
        "executors_rss_bytes": snapshot.executors_rss_bytes,
        "retained_results": snapshot.retained_results,
        "retained_bytes": snapshot.retained_bytes,
    }


def _recent(result: TaskResult) -> dict[str, Any]:
    return {
        "task_id": result.task_id,
        "state": result.state.value,
        "failure_code": result.failure_code or "",
        "phase": result.phase.value,
        "total_ms": result.timings.total_ms,
        "calls_total": result.call_stats.calls_total,
        "finished_at_ms": result.finished_at_ms,
    }


def _history(window: HistoryWindow, *, full: bool) -> dict[str, Any]:
    """`full`: the whole window, which replaces what the page has; else points to add."""
    return {
        "full": full,
        "window_s": HISTORY_S,
        "step_ms": STEP_MS,
        "start_ms": window.start_ms,
        "end_ms": window.end_ms,
        "succeeded": window.succeeded,
        "failed": window.failed,
        "calls": window.calls,
        "p50_ms": window.p50_ms,
        "p99_ms": window.p99_ms,
    }


def _executor(view: ExecutorView) -> dict[str, Any]:
    return {
        "executor_id": view.executor_id,
        "state": view.state.value,
        "pid": view.pid,
        "rss_bytes": view.rss_bytes,
        "calls_served": view.calls_served,
        "restarts": view.restarts,
        "running_call_id": view.running_call_id,
    }


def _change_key(message: dict[str, Any]) -> str:
    """The message without what drifts all the time (clock, RSS, the history's newest
    points, which go with the next snapshot sent): a change here is news."""
    totals = {
        name: figure for name, figure in message["totals"].items() if not name.endswith("_bytes")
    }
    executors = [
        {name: field for name, field in view.items() if name != "rss_bytes"}
        for view in message["executors"]
    ]
    lasting = {**message, "at_ms": 0, "totals": totals, "executors": executors, "history": None}
    return json.dumps(lasting)
