"""A `WatchTasks` stream as the watch hub sees it: the task ids it follows and its buffer.

The buffer holds at most one pending update per task id: a newer
non-terminal update replaces an older one that the reader has not taken yet,
and the terminal update is never replaced. So a slow reader costs memory in
proportion to the tasks it follows, never to the updates it missed, and it
always receives the terminal result. The front end takes updates from the
stream; the hub is the only writer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from blockx.slots import TaskSnapshot, WorkerError


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
