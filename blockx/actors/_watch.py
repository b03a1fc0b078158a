"""The watch fan-out: fans task updates out to the `WatchTasks` and `RunTasks` streams.

It is part of the slot-table actor (a plain object the actor calls, not an
actor of its own): every update it delivers comes from the slot table, so a
hop through an inbox of its own cost a wake-up per update and bought nothing.
It counts streams per task id and tells the slot table, through its inbox,
when a task gets its first stream and when it loses its last one (cleanly,
or because a client went away), which is what the slot table's watch grace
runs on. It publishes one figure for others to read, `open_streams`.
"""

from __future__ import annotations

import trio

from blockx.actors._inbox import Inbox
from blockx.actors._messages import SlotTableMessage, WatchChanged
from blockx.actors._streams import HubStream
from blockx.slots import NotFound, TaskSnapshot


class WatchFanout:
    """The streams and who follows what; tells `slot_table` of first and last streams."""

    def __init__(self, *, slot_table: Inbox[SlotTableMessage]) -> None:
        self._slot_table = slot_table
        self._streams: dict[str, set[HubStream]] = {}
        self._all: set[HubStream] = set()
        self._emptied = trio.Event()
        self.open_streams = 0
        """Published: how many streams are open."""

    async def all_closed(self) -> None:
        """Until no stream is open."""
        while self._all:
            await self._emptied.wait()
            self._emptied = trio.Event()

    def subscribe(self, stream: HubStream, snapshots: tuple[TaskSnapshot, ...]) -> None:
        """Deliver `snapshots` (the current state) to `stream`, then every later update."""
        if stream.abandoned:
            return  # its reader left before it was subscribed: nothing to undo
        self._all.add(stream)
        self.open_streams = len(self._all)
        for task_id in stream.task_ids:
            self._follow(task_id, stream)
        for snapshot in snapshots:
            self.publish(snapshot)

    def follow(self, stream: HubStream, task_id: str) -> None:
        """`stream` (subscribed) follows `task_id` from now on: it was accepted on it."""
        if stream in self._all:
            self._follow(task_id, stream)
        else:  # its reader left before the fan-out heard of the task: a watch broken at once
            self._slot_table.post(WatchChanged(task_id=task_id, attached=False, broken=True))

    def wants_changes(self, task_id: str) -> bool:
        """Whether a stream follows `task_id` that wants more than its terminal update."""
        return any(stream.every_change for stream in self._streams.get(task_id, ()))

    def publish(self, snapshot: TaskSnapshot) -> None:
        streams = self._streams.get(snapshot.task_id)
        if not streams:
            return
        for stream in streams:
            stream.offer(snapshot)
        if snapshot.is_terminal:
            # Nothing more will come for this task: its streams stop counting.
            del self._streams[snapshot.task_id]

    def unsubscribe(self, stream: HubStream, *, broken: bool) -> None:
        """The stream ended: cleanly (`broken` False) or because its client went away."""
        self._drop(stream, broken=broken)

    def forget(self, task_id: str) -> None:
        """The slot table no longer knows `task_id`: streams still on it are told NotFound."""
        for stream in self._streams.pop(task_id, set()):
            if stream.lose(task_id, NotFound(task_id=task_id)):
                self._drop(stream, broken=False)

    def close_all(self) -> None:
        """Shutdown: every stream ends after what it already has is delivered."""
        for stream in self._all:
            stream.close()

    def _follow(self, task_id: str, stream: HubStream) -> None:
        streams = self._streams.setdefault(task_id, set())
        if not streams:
            self._slot_table.post(WatchChanged(task_id=task_id, attached=True))
        streams.add(stream)

    def _drop(self, stream: HubStream, *, broken: bool) -> None:
        if stream not in self._all:
            return
        self._all.discard(stream)
        self.open_streams = len(self._all)
        if not self._all:
            self._emptied.set()
        for task_id in stream.task_ids:
            streams = self._streams.get(task_id)
            if streams is None or stream not in streams:
                continue
            streams.discard(stream)
            if not streams:
                del self._streams[task_id]
                self._slot_table.post(WatchChanged(task_id=task_id, attached=False, broken=broken))
