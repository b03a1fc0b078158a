"""The terminal snapshots of the results the slot table retains, published for the gRPC
handlers: a watch or a result request about tasks that have all ended is answered from
here, on the handler's own thread, without a round trip through the slot-table actor.

The slot-table actor is the one writer. It adds a task's terminal snapshot in the
step the task converges (the machine retains every result it converges to) and
drops it in the step the machine forgets the task (purged, evicted, lease ended,
shut down). A retained task cannot run again until it is forgotten (a submit of its
id is answered with its result), so a snapshot held here is what the actor itself
would answer. Readers on any thread take one lock, as the watch streams do.

It holds the newest `capacity` snapshots at most: a task it no longer holds is
answered the usual way, by the actor. It must never hold a snapshot of a task the
machine has forgotten, nor answer for a task it does not hold.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Sequence

from blockx.slots import TaskSnapshot

RETAINED_SNAPSHOTS = 4_096
"""Terminal snapshots published at most (the newest); older ones are asked of the actor."""


class RetainedSnapshots:
    """Task id -> terminal snapshot, for the results the slot table retains (see above)."""

    def __init__(self, capacity: int = RETAINED_SNAPSHOTS) -> None:
        self._capacity = capacity
        self._lock = threading.Lock()
        self._snapshots: collections.OrderedDict[str, TaskSnapshot] = collections.OrderedDict()

    def __len__(self) -> int:
        with self._lock:
            return len(self._snapshots)

    def retained(self, snapshot: TaskSnapshot) -> None:
        """The task of `snapshot` (terminal) converged and its result is retained."""
        assert snapshot.is_terminal, snapshot
        with self._lock:
            snapshots = self._snapshots
            snapshots[snapshot.task_id] = snapshot
            snapshots.move_to_end(snapshot.task_id)
            if len(snapshots) > self._capacity:
                snapshots.popitem(last=False)

    def forgotten(self, task_id: str) -> None:
        """The machine no longer knows `task_id`."""
        with self._lock:
            self._snapshots.pop(task_id, None)

    def get(self, task_id: str) -> TaskSnapshot | None:
        """The terminal snapshot of `task_id`, or None: ask the actor."""
        with self._lock:
            return self._snapshots.get(task_id)

    def all_of(self, task_ids: Sequence[str]) -> list[TaskSnapshot] | None:
        """The terminal snapshots of `task_ids`, in order, once each; None unless every one
        is held here (then the actor answers for all of them)."""
        with self._lock:
            snapshots = self._snapshots
            found: dict[str, TaskSnapshot] = {}
            for task_id in task_ids:
                snapshot = snapshots.get(task_id)
                if snapshot is None:
                    return None
                found[task_id] = snapshot
        return list(found.values())
