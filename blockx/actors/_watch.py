"""The watch hub: fans task updates out to `WatchTasks` streams.

It counts streams per task id and tells the slot-table actor when a task gets
its first stream and when it loses its last one (cleanly, or because a client
went away), which is what the slot table's watch grace runs on. It publishes
one figure for others to read, `open_streams`, updated by its own steps.
"""

from __future__ import annotations

import logging

import trio

from blockx.actors._inbox import Inbox
from blockx.actors._messages import (
    CloseAllStreams,
    Follow,
    Forget,
    Publish,
    SlotTableMessage,
    Subscribe,
    Unsubscribe,
    WatchChanged,
    WatchHubMessage,
)
from blockx.actors._streams import HubStream
from blockx.slots import NotFound, TaskSnapshot

logger = logging.getLogger("blockx.watch")


class WatchHub:
    """The actor: takes `inbox`, tells `slot_table`. Start `run` with `nursery.start`."""

    def __init__(
        self, *, inbox: Inbox[WatchHubMessage], slot_table: Inbox[SlotTableMessage]
    ) -> None:
        self._receive = inbox.receive
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

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        async for message in self._receive:
            self._on_message(message)
            self.open_streams = len(self._all)

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
            case Follow(stream=stream, task_id=task_id):
                if stream in self._all:
                    self._follow(task_id, stream)
                else:  # its reader left before it heard of the task: a watch broken at once
                    self._slot_table.post(
                        WatchChanged(task_id=task_id, attached=False, broken=True)
                    )
            case Publish(snapshot=snapshot):
                self._deliver(snapshot)
            case Unsubscribe(stream=stream, broken=broken):
                self._drop(stream, broken=broken)
            case Forget(task_id=task_id):
                for stream in self._streams.pop(task_id, set()):
                    if stream.lose(task_id, NotFound(task_id=task_id)):
                        self._drop(stream, broken=False)
            case CloseAllStreams():
                for stream in self._all:
                    stream.close()

    def _follow(self, task_id: str, stream: HubStream) -> None:
        streams = self._streams.setdefault(task_id, set())
        if not streams:
            self._slot_table.post(WatchChanged(task_id=task_id, attached=True))
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

    def _drop(self, stream: HubStream, *, broken: bool) -> None:
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
                self._slot_table.post(WatchChanged(task_id=task_id, attached=False, broken=broken))
