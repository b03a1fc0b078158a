"""What the dashboard reads live: this hub's worker sessions, its series, and a stream of ticks.

    GET /v1/workers     this hub's open worker sessions and the attempts each holds
    GET /v1/stats       the series of the last hour (`_series`), this hub's own
    GET /v1/events      server-sent events: a `tick` at once and then every second, with
                        the queues (as `GET /v1/queues`) and the last two buckets of stats

Admin only, by bearer token or session cookie, as the rest of the admin API.
The ticks come from one `Ticker` per hub: while at least one stream is open it
reads the queues once a second (one transaction, which also checks the
credential of every stream: a revoked one's stream ends) and hands the same
event to every stream; with no stream open it reads nothing. At most
`MAX_STREAMS` are open at once (503 beyond). A stream whose client does not
take its ticks (`STREAM_BUFFER` behind) is dropped, not buffered; every stream
ends when the hub drains.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

import attrs
import trio

from blockx.hub._admin_api import AdminAnswer, AdminWork, _as_admin, list_queues
from blockx.hub._api import _as_producer, unreachable
from blockx.hub._auth import is_admin
from blockx.hub._browser import Refusal
from blockx.hub._committer import Committer
from blockx.hub._series import Series
from blockx.hub._store import StoreError, Tx
from blockx.hubwire import AttemptStatus, Capability, dumps
from blockx.net.http import RECEIVE_BYTES, Connection, Request, respond_keeping

logger = logging.getLogger("blockx.hub")

WORKERS_PATH: Final = "/v1/workers"
STATS_PATH: Final = "/v1/stats"
EVENTS_PATH: Final = "/v1/events"
MAX_STREAMS: Final = 32
TICK_S: Final = 1.0
STREAM_BUFFER: Final = 4
"""Ticks a stream may have waiting before its client counts as too slow and is dropped."""
EVENT_BUCKETS: Final = 2
"""The buckets of the series a tick carries: the one filling and the one before."""
_STATUS: Final = {AttemptStatus.OFFERED: "OFFERED", AttemptStatus.RUNNING: "STARTED"}
_EVENTS_HEAD: Final = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-store\r\n"
    b"connection: close\r\n\r\n"
)


@attrs.frozen(kw_only=True)
class WorkerView:
    """One open worker session, as `GET /v1/workers` shows it (a copy, taken at once)."""

    instance_id: str
    queue_id: str
    credential_id: str
    capabilities: tuple[Capability, ...]
    capacity: int
    held: Mapping[str, AttemptStatus]
    opened_at_ms: int
    last_heard_ms: int
    draining: bool

    def json(self, tasks: Mapping[str, str]) -> dict[str, Any]:
        """Its JSON form; `tasks`: the task of each attempt, by attempt id."""
        return {
            "instance_id": self.instance_id,
            "queue_id": self.queue_id,
            "credential_id": self.credential_id,
            "capabilities": [attrs.asdict(capability) for capability in self.capabilities],
            "capacity": self.capacity,
            "held": len(self.held),
            "opened_at_ms": self.opened_at_ms,
            "last_heard_ms": self.last_heard_ms,
            "draining": self.draining,
            "attempts": [
                {
                    "task_id": tasks.get(attempt_id),
                    "attempt_id": attempt_id,
                    "status": _STATUS[status],
                }
                for attempt_id, status in sorted(self.held.items())
                if status in _STATUS
            ],
        }


class Live:
    """The live reads of one hub: the admin requests they answer, and the `ticker`."""

    def __init__(
        self,
        committer: Committer,
        *,
        hub_id: str,
        now_ms: Callable[[], int],
        series: Series,
        workers: Callable[[], Iterable[WorkerView]],
    ) -> None:
        self._committer = committer
        self._hub_id = hub_id
        self._now_ms = now_ms
        self._series = series
        self._workers = workers
        self.ticker = Ticker(committer, now_ms=now_ms, stats=self.stats)

    def stats(self, now_ms: int, buckets: int | None = None) -> dict[str, Any]:
        return {"hub_id": self._hub_id, **self._series.snapshot(now_ms, buckets)}

    def admin_request(self, method: bytes, path: str) -> AdminWork | None:
        """What a request for `path` does, if it is one of the live reads answered in one
        JSON body (None for any other path)."""
        if path == STATS_PATH:
            now_ms = self._now_ms()
            return _as_admin(method, lambda tx: (200, self.stats(now_ms)))
        if path == WORKERS_PATH:
            return _as_admin(method, self._read_workers(self._now_ms(), list(self._workers())))
        return None

    def _read_workers(self, now_ms: int, views: list[WorkerView]) -> Callable[[Tx], AdminAnswer]:
        def read(tx: Tx) -> AdminAnswer:
            held = [attempt_id for view in views for attempt_id in view.held]
            tasks = tx.tasks_of_attempts(held) if held else {}
            workers = [view.json(tasks) for view in views]
            return 200, {"hub_id": self._hub_id, "at_ms": now_ms, "workers": workers}

        return read

    async def serve_events(
        self,
        wire: trio.abc.Stream,
        connection: Connection,
        request: Request,
        caller: str | Refusal,
    ) -> bool:
        """Answer `GET /v1/events`: the stream of ticks, until the client goes, is too slow,
        its credential is revoked, or the hub drains (the connection is done then); or a
        refusal (the connection may be kept): whether it is kept."""
        if isinstance(caller, Refusal):
            status, body = caller.status, {"error": caller.error}
        else:
            may = _as_producer(caller, None, _as_admin(request.method, lambda tx: (200, None)))
            try:
                status, body = await self._committer.do(may)
            except StoreError as error:
                status, body = 503, {"error": unreachable(error)}
            stream = self.ticker.open(caller) if status == 200 else None
            if stream is not None:
                await self._stream(wire, stream)
                return False
            if status == 200:
                status, body = 503, {"error": f"at most {MAX_STREAMS} event streams at once"}
        text = dumps(body) + "\n"
        return await respond_keeping(
            wire, connection, request, status, text, content_type="application/json"
        )

    async def _stream(self, wire: trio.abc.Stream, stream: EventStream) -> None:
        """Send the ticks as they come, until the stream is ended or the client goes
        (noticed at once: it closes its side)."""
        try:
            with stream.scope:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(_until_gone, wire, nursery.cancel_scope)
                    with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                        await wire.send_all(_EVENTS_HEAD)
                        async for event in stream.ticks:
                            await wire.send_all(event)
                    nursery.cancel_scope.cancel()
        finally:
            self.ticker.close(stream)


async def _until_gone(wire: trio.abc.Stream, scope: trio.CancelScope) -> None:
    """Until the client closes its side of the connection, then end the stream (whatever
    it sends meanwhile is read and dropped: an event stream's client sends nothing)."""
    with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
        while await wire.receive_some(RECEIVE_BYTES):
            pass
    scope.cancel()


@attrs.define(eq=False)
class EventStream:
    """One client's stream: the ticks waiting for it, and the scope its answer runs in
    (cancelled to end it)."""

    token: str
    ticks: trio.MemoryReceiveChannel[bytes]
    _send: trio.MemorySendChannel[bytes]
    scope: trio.CancelScope = attrs.Factory(trio.CancelScope)

    def deliver(self, event: bytes) -> bool:
        """Whether the client keeps up: it has room for one more tick."""
        try:
            self._send.send_nowait(event)
        except (trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
            return False
        return True


class Ticker:
    """The one reader of the hub's state for every open event stream."""

    def __init__(
        self,
        committer: Committer,
        *,
        now_ms: Callable[[], int],
        stats: Callable[[int, int], dict[str, Any]],
    ) -> None:
        self._committer = committer
        self._now_ms = now_ms
        self._stats = stats
        self._streams: set[EventStream] = set()
        self._wanted = trio.Event()
        """Set when a stream opens: a ticker with none to serve starts again."""
        self._latest: bytes | None = None
        """The last tick, while streams are open: a new stream gets it at once."""
        self.stopped = False
        self.reads = 0
        """Published: transactions the ticker ran."""

    @property
    def streams(self) -> int:
        return len(self._streams)

    def open(self, token: str) -> EventStream | None:
        """A new stream for a request made with `token` (an admin's); None if
        `MAX_STREAMS` are open, or the hub drains."""
        if self.stopped or len(self._streams) >= MAX_STREAMS:
            return None
        send, receive = trio.open_memory_channel[bytes](STREAM_BUFFER)
        stream = EventStream(token=token, ticks=receive, send=send)
        self._streams.add(stream)
        if self._latest is not None:
            stream.deliver(self._latest)
        self._wanted.set()
        return stream

    def close(self, stream: EventStream) -> None:
        self._streams.discard(stream)
        stream.scope.cancel()

    def stop(self) -> None:
        """The hub drains: every stream ends now, and no new one opens."""
        self.stopped = True
        for stream in list(self._streams):
            self.close(stream)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Tick every `TICK_S` while a stream is open; sleep while none is."""
        task_status.started()
        while True:
            await self._wanted.wait()
            self._wanted = trio.Event()
            next_s = trio.current_time()
            while self._streams:
                await self._tick()
                next_s = max(next_s + TICK_S, trio.current_time())
                await trio.sleep_until(next_s)
            self._latest = None

    async def _tick(self) -> None:
        now_ms = self._now_ms()
        tokens = frozenset(stream.token for stream in self._streams)
        try:
            admins, queues = await self._committer.do(_read_tick(tokens, now_ms))
        except StoreError as error:
            logger.warning("hub: the dashboard's tick could not be read: %s", error)
            return
        self.reads += 1
        body = {"at_ms": now_ms, "queues": queues, "stats": self._stats(now_ms, EVENT_BUCKETS)}
        self._latest = event = f"event: tick\ndata: {dumps(body)}\n\n".encode()
        for stream in list(self._streams):
            if stream.token not in admins or not stream.deliver(event):
                self.close(stream)


def _read_tick(
    tokens: frozenset[str], now_ms: int
) -> Callable[[Tx], tuple[frozenset[str], list[dict[str, Any]]]]:
    """Which of `tokens` are still an admin's, and the queues."""
    read_queues = list_queues(now_ms)

    def read(tx: Tx) -> tuple[frozenset[str], list[dict[str, Any]]]:
        return frozenset(token for token in tokens if is_admin(tx, token)), read_queues(tx)

    return read
