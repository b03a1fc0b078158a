"""The watch hub: fans task updates out to `WatchTasks` streams.

A `WatchStream` is the hub's handle on one open stream. Its buffer holds at
most one pending update per task id it follows: a newer non-terminal update
replaces an older one that the reader has not taken yet, and the terminal
update is never replaced. So a slow reader costs memory in proportion to the
tasks it follows, never to the updates it missed, and it always receives the
terminal result. The front end takes updates from the stream; the hub is the
only writer.

The hub counts streams per task id and tells the slot-table actor when a task
gets its first stream and when it loses its last one (cleanly, or because a
client went away), which is what the slot table's watch grace runs on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

import trio

from blockx.actors._messages import (
    CloseAllStreams,
    Forget,
    Publish,
    SlotTableMessage,
    Subscribe,
    Unsubscribe,
    WatchChanged,
    WatchHubMessage,
)
from blockx.slots import NotFound, TaskSnapshot, WorkerError

logger = logging.getLogger("blockx.watch")


class WatchStream:
    """One stream's task ids and its bounded buffer of pending updates.

    `wake` is called (from the hub's task) whenever there is something new to
    read; the reader then calls `take()`. The stream is `finished` once every
    task's terminal update was taken, or it failed, or it was closed and
    drained.
    """

    def __init__(self, task_ids: Iterable[str], *, wake: Callable[[], None]) -> None:
        self.task_ids = tuple(dict.fromkeys(task_ids))
        self._wake = wake
        self._pending: dict[str, TaskSnapshot] = {}
        self._open_tasks = set(self.task_ids)
        self.error: WorkerError | None = None
        self.closed = False
        self.abandoned = False
        """Set by the reader when it stops reading, before it unsubscribes."""

    def offer(self, snapshot: TaskSnapshot) -> None:
        if snapshot.task_id not in self._open_tasks:
            return  # terminal already queued, or not ours
        self._pending[snapshot.task_id] = snapshot
        if snapshot.is_terminal:
            self._open_tasks.discard(snapshot.task_id)
        self._wake()

    def fail(self, error: WorkerError) -> None:
        self.error = error
        self._open_tasks.clear()
        self._wake()

    def close(self) -> None:
        self.closed = True
        self._wake()

    def take(self) -> list[TaskSnapshot]:
        updates = list(self._pending.values())
        self._pending.clear()
        return updates

    @property
    def following(self) -> frozenset[str]:
        """Task ids whose terminal update has not been queued yet."""
        return frozenset(self._open_tasks)

    @property
    def finished(self) -> bool:
        if self._pending:
            return False
        return self.error is not None or self.closed or not self._open_tasks


class WatchHub:
    """The actor. `post` is its inbox; `run` is its task."""

    def __init__(self, *, to_slot_table: Callable[[SlotTableMessage], None]) -> None:
        self._to_slot_table = to_slot_table
        self._send, self._receive = trio.open_memory_channel[WatchHubMessage](float("inf"))
        self._streams: dict[str, set[WatchStream]] = {}
        self._all: set[WatchStream] = set()
        self._emptied = trio.Event()

    def post(self, message: WatchHubMessage) -> None:
        self._send.send_nowait(message)

    @property
    def stream_count(self) -> int:
        return len(self._all)

    async def all_closed(self) -> None:
        """Until no stream is open."""
        while self._all:
            await self._emptied.wait()
            self._emptied = trio.Event()

    async def run(self) -> None:
        async for message in self._receive:
            self._on_message(message)

    def _on_message(self, message: WatchHubMessage) -> None:
        match message:
            case Subscribe(stream=stream, snapshots=snapshots):
                if stream.abandoned:
                    return  # its reader left before it was subscribed: nothing to undo
                self._all.add(stream)
                for task_id in stream.task_ids:
                    self._follow(task_id, stream)
                for snapshot in snapshots:
                    self._deliver(snapshot)
            case Publish(snapshot=snapshot):
                self._deliver(snapshot)
            case Unsubscribe(stream=stream, broken=broken):
                self._drop(stream, broken=broken)
            case Forget(task_id=task_id):
                for stream in list(self._streams.get(task_id, ())):
                    stream.fail(NotFound(task_id=task_id))
                    self._drop(stream, broken=False)
            case CloseAllStreams():
                for stream in self._all:
                    stream.close()

    def _follow(self, task_id: str, stream: WatchStream) -> None:
        streams = self._streams.setdefault(task_id, set())
        if not streams:
            self._to_slot_table(WatchChanged(task_id=task_id, attached=True))
        streams.add(stream)

    def _deliver(self, snapshot: TaskSnapshot) -> None:
        streams = self._streams.get(snapshot.task_id)
        if not streams:
            return
        for stream in streams:
            stream.offer(snapshot)
        if snapshot.is_terminal:
            # Nothing more will come for this task: its streams stop counting.
            del self._streams[snapshot.task_id]

    def _drop(self, stream: WatchStream, *, broken: bool) -> None:
        if stream not in self._all:
            return
        self._all.discard(stream)
        if not self._all:
            self._emptied.set()
        for task_id in stream.task_ids:
            streams = self._streams.get(task_id)
            if streams is None or stream not in streams:
                continue
            streams.discard(stream)
            if not streams:
                del self._streams[task_id]
                self._to_slot_table(WatchChanged(task_id=task_id, attached=False, broken=broken))
