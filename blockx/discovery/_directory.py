"""A coordinator's live view of the workers registered under one etcd prefix.

Theory of operation: the view is rebuilt from a snapshot (`reset`, after a
Range) and then follows the key events of a watch (`apply`), in revision
order; an event older than the view is ignored, so replaying a batch twice is
harmless. A value that is not a heartbeat removes the worker from the view
and is reported back to the caller, who logs it. Placement asks for
`placement_order()`: workers that are not draining and have a free slot,
most free slots first, equals in random order (so that coordinators with the
same view do not all pick the same worker). `note_placed` lowers a worker's free count at once,
until that worker's next heartbeat says the truth, so that a burst of tasks
spreads instead of piling onto the worker that looked emptiest.

Pure: no I/O, no clock, no logging; randomness comes from the `draw` it is given.
"""

from __future__ import annotations

import enum
import random
from collections.abc import Callable, Iterable

import attrs

from blockx.discovery._heartbeat import MalformedHeartbeat, WorkerHeartbeat


class KeyEventKind(enum.Enum):
    PUT = "PUT"
    DELETE = "DELETE"


@attrs.frozen(kw_only=True)
class KeyEvent:
    """A change of one key, at `mod_revision` (a delete has no value)."""

    kind: KeyEventKind
    key: str
    mod_revision: int
    value: bytes = b""


@attrs.frozen(kw_only=True)
class Rejected:
    """A key whose value is not a heartbeat, and why."""

    key: str
    error: MalformedHeartbeat


@attrs.define
class WorkerDirectory:
    """The workers under `prefix`, keyed by their etcd key."""

    prefix: str
    revision: int = 0
    """The newest revision the view reflects."""
    _workers: dict[str, WorkerHeartbeat] = attrs.field(factory=dict, init=False)
    _key_revisions: dict[str, int] = attrs.field(factory=dict, init=False)
    _placed: dict[str, int] = attrs.field(factory=dict, init=False)
    """Placements per address since that worker's last heartbeat."""
    _draw: Callable[[], float] = attrs.field(default=random.random, kw_only=True, alias="draw")
    """Orders workers that are equal for placement: a number in [0, 1)."""

    def reset(self, *, revision: int, entries: Iterable[tuple[str, bytes, int]]) -> list[Rejected]:
        """Replace the view with a snapshot: (key, value, mod_revision) at `revision`."""
        self._workers.clear()
        self._key_revisions.clear()
        self._placed.clear()
        self.revision = revision
        rejected: list[Rejected] = []
        for key, value, mod_revision in entries:
            problem = self._put(key, value, mod_revision)
            if problem is not None:
                rejected.append(problem)
        return rejected

    def apply(self, events: Iterable[KeyEvent]) -> list[Rejected]:
        """Follow a batch of watch events; events at or below `revision` are skipped."""
        rejected: list[Rejected] = []
        # One revision's events arrive together and share it: compare with the
        # revision before the batch, not with one raised inside it.
        floor = newest = self.revision
        for event in events:
            if event.mod_revision <= floor or not event.key.startswith(self.prefix):
                continue
            newest = max(newest, event.mod_revision)
            match event.kind:
                case KeyEventKind.PUT:
                    problem = self._put(event.key, event.value, event.mod_revision)
                    if problem is not None:
                        rejected.append(problem)
                case KeyEventKind.DELETE:
                    self._forget(event.key)
        self.revision = newest
        return rejected

    def workers(self) -> tuple[WorkerHeartbeat, ...]:
        """Every worker in the view, by address."""
        return tuple(sorted(self._workers.values(), key=lambda worker: worker.address))

    def free_slots(self, address: str) -> int:
        """The worker's free slots less the placements made since its last heartbeat."""
        for worker in self._workers.values():
            if worker.address == address:
                return self._free(worker)
        return 0

    def placement_order(self) -> tuple[WorkerHeartbeat, ...]:
        """Workers to try for a new task: not draining, a free slot, most free first.

        Ties go to the worker running fewer tasks, then are broken at random:
        many coordinators share one view, and a fixed order would send all of
        their first tasks to the same worker.
        """
        ranked = [
            ((-free, worker.running_tasks, self._draw()), worker)
            for worker in self._workers.values()
            if not worker.draining and (free := self._free(worker)) > 0
        ]
        ranked.sort(key=lambda entry: entry[0])
        return tuple(worker for _, worker in ranked)

    def note_placed(self, address: str) -> None:
        """A slot was reserved on `address`; count it until the worker's next heartbeat."""
        if any(worker.address == address for worker in self._workers.values()):
            self._placed[address] = self._placed.get(address, 0) + 1

    def check_invariants(self) -> None:
        assert self._workers.keys() == self._key_revisions.keys()
        for key, worker in self._workers.items():
            assert key.startswith(self.prefix), key
            assert self._key_revisions[key] <= self.revision
            assert worker.address
        addresses = {worker.address for worker in self._workers.values()}
        assert set(self._placed) <= addresses, (self._placed, addresses)
        assert all(count > 0 for count in self._placed.values())

    def _free(self, worker: WorkerHeartbeat) -> int:
        return max(0, worker.free_slots - self._placed.get(worker.address, 0))

    def _put(self, key: str, value: bytes, mod_revision: int) -> Rejected | None:
        if not key.startswith(self.prefix):
            return None
        try:
            worker = WorkerHeartbeat.from_json(value)
        except MalformedHeartbeat as error:
            self._forget(key)
            return Rejected(key=key, error=error)
        self._forget(key)
        self._workers[key] = worker
        self._key_revisions[key] = mod_revision
        return None

    def _forget(self, key: str) -> None:
        worker = self._workers.pop(key, None)
        self._key_revisions.pop(key, None)
        if worker is not None:
            self._placed.pop(worker.address, None)
