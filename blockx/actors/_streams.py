"""The streams the watch fan-out feeds: a `WatchTasks` stream and a `RunTasks` stream.

A `WatchTasks` stream (`WatchStream`) follows the task ids it was opened
with.

The buffer holds at most one pending update per task id: a newer
non-terminal update replaces an older one that the reader has not taken yet,
and the terminal update is never replaced. So a slow reader costs memory in
proportion to the tasks it follows, never to the updates it missed, and it
always receives the terminal result. The front end takes updates from the
stream; the fan-out is the only writer.

A `RunTasks` stream (`TaskStream`) follows the tasks submitted on it as they
are accepted, and carries the answers to those submits as well.

The front end may read a stream on another thread than the actors' (see
`blockx.api._bridge`), so every method takes the stream's lock; `wake` and
`room` are the front end's own hand-overs to its thread.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Protocol

import attrs
import trio

from blockx.slots import TaskSnapshot, WorkerError


class HubStream(Protocol):
    """What the watch fan-out needs of a stream."""

    abandoned: bool
    every_change: bool
    """It wants each change of the tasks it follows, not only their terminal update."""

    @property
    def task_ids(self) -> Iterable[str]: ...

    def offer(self, snapshot: TaskSnapshot) -> None: ...

    def lose(self, task_id: str, error: WorkerError) -> bool:
        """The worker forgot `task_id`. True: the whole stream has ended with it."""
        ...

    def close(self) -> None: ...


class WatchStream:
    """One stream's task ids and its bounded buffer of pending updates.

    `wake` is called (from the slot-table actor) whenever there is something new to
    read; the reader then calls `take()`. The stream is `finished` once every
    task's terminal update was taken, or it failed, or it was closed and
    drained.
    """

    every_change = True

    def __init__(self, task_ids: Iterable[str], *, wake: Callable[[], None]) -> None:
        self.task_ids = tuple(dict.fromkeys(task_ids))
        self._wake = wake
        self._lock = threading.Lock()
        self._pending: dict[str, TaskSnapshot] = {}
        self._open_tasks = set(self.task_ids)
        self.error: WorkerError | None = None
        self.closed = False
        self.abandoned = False
        """Set by the reader when it stops reading, before it unsubscribes."""

    def offer(self, snapshot: TaskSnapshot) -> None:
        with self._lock:
            if snapshot.task_id not in self._open_tasks:
                return  # terminal already queued, or not ours
            self._pending[snapshot.task_id] = snapshot
            if snapshot.is_terminal:
                self._open_tasks.discard(snapshot.task_id)
        self._wake()

    def lose(self, task_id: str, error: WorkerError) -> bool:
        self.fail(error)
        return True

    def fail(self, error: WorkerError) -> None:
        with self._lock:
            self.error = error
            self._open_tasks.clear()
        self._wake()

    def close(self) -> None:
        with self._lock:
            self.closed = True
        self._wake()

    def take(self) -> list[TaskSnapshot]:
        with self._lock:
            updates = list(self._pending.values())
            self._pending.clear()
        return updates

    @property
    def following(self) -> frozenset[str]:
        """Task ids whose terminal update has not been queued yet."""
        with self._lock:
            return frozenset(self._open_tasks)

    @property
    def finished(self) -> bool:
        with self._lock:
            if self._pending:
                return False
            return self.error is not None or self.closed or not self._open_tasks


@attrs.frozen
class Accepted:
    """A submit on the stream was admitted (or named a task the worker already knows)."""

    snapshot: TaskSnapshot


@attrs.frozen
class Refused:
    """A submit on the stream was not admitted; nothing of the task runs."""

    task_id: str
    error: WorkerError


@attrs.frozen
class Finished:
    """A task the stream follows ended: `snapshot` is terminal and holds the result."""

    snapshot: TaskSnapshot


StreamEvent = Accepted | Refused | Finished


ENDED_KEPT = 100_000
"""How many ended task ids a `RunTasks` stream remembers: sent again after more than this
many others ended on the stream, a task id is answered as one that ended elsewhere
(its answer, then its terminal update)."""


class TaskStream:
    """One `RunTasks` stream: the submits it has in flight, the tasks it follows, its events.

    Three parties touch it, each its own fields. The front end's handler counts
    what it posted (`posted`), marks the end of its input (`end_input`) and
    takes the events in order (`take`). The slot-table actor answers each
    submit (`answer`: an accepted task is followed from then on) and counts
    the submits it holds until a slot is free (`held`). The watch fan-out offers
    the updates of the tasks followed (`offer`); only terminal updates become
    events. The stream is `full` (the handler stops reading submits) while
    `window` submits are unanswered or `window` events wait to be taken: a
    client that writes and never reads its answers is held by HTTP/2 flow
    control, not by the worker's memory (which once grew by 0.8 KiB a task
    until it stopped). So the events waiting are bounded by twice the window
    plus the slots (terminal updates of the tasks accepted); the ended task ids
    it remembers are bounded by `ENDED_KEPT`.
    """

    every_change = False

    def __init__(self, *, wake: Callable[[], None], room: Callable[[], None], window: int) -> None:
        """`wake`: there are events to take, or the stream may be finished. `room`: the
        stream is no longer `full`."""
        self._wake = wake
        self._room = room
        self._lock = threading.Lock()
        self.window = window
        self._events: list[StreamEvent] = []
        self._following: set[str] = set()
        self._posted = 0
        self._sent = 0
        """Submits posted, and answers moved to the events (they go in order)."""
        self._answers: dict[int, StreamEvent] = {}
        """Answers waiting for an earlier one, by place."""
        self._unsent: set[str] = set()
        """Accepted tasks whose answer is still waiting in `_answers`."""
        self._early: dict[str, TaskSnapshot] = {}
        """Terminal updates of those tasks, sent right after their answer."""
        self._ended: dict[str, None] = {}
        """Task ids whose terminal update is sent (each goes once), the last `ENDED_KEPT`."""
        self.unanswered = 0
        """Submits posted to the slot table and not answered yet (the handler's count)."""
        self.held = 0
        """Of those, how many the slot table holds until a slot is free (the slot table's)."""
        self.input_done = False
        self.closed = False
        self.abandoned = False
        """Set by the reader when it stops reading, before it unsubscribes."""

    @property
    def task_ids(self) -> frozenset[str]:
        """The accepted tasks whose terminal update has not come yet."""
        with self._lock:
            return frozenset(self._following)

    @property
    def full(self) -> bool:
        """`window` submits are unanswered, or `window` events are not taken yet: the
        reader waits for `room`."""
        with self._lock:
            return self._full()

    def _full(self) -> bool:
        return self.unanswered >= self.window or len(self._events) >= self.window

    def posted(self) -> int:
        """A submit is on its way; returns its place in the stream, for `answer`."""
        with self._lock:
            self.unanswered += 1
            self._posted += 1
            return self._posted - 1

    def end_input(self) -> None:
        with self._lock:
            self.input_done = True
        self._wake()

    def answer(self, place: int, task_id: str, answer: TaskSnapshot | WorkerError) -> None:
        """The answer to the submit posted `place`-th. Answers go out in the order of the
        submits, whoever gives them and in whatever order."""
        with self._lock:
            was_full = self._full()
            self.unanswered -= 1
            if isinstance(answer, WorkerError):
                self._answers[place] = Refused(task_id, answer)
            else:
                self._answers[place] = Accepted(answer)
                if not answer.is_terminal and task_id not in self._ended:
                    self._following.add(task_id)  # from now on (the fan-out hears a step later)
                    self._unsent.add(task_id)
            self._send_answers()
            room = was_full and not self._full()
        if room:
            self._room()
        self._wake()

    def _send_answers(self) -> None:
        """Move the answers that are next in order to the events; a task's terminal update
        that came before its answer could go follows it."""
        while self._sent in self._answers:
            event = self._answers.pop(self._sent)
            self._sent += 1
            self._events.append(event)
            if isinstance(event, Accepted):
                task_id = event.snapshot.task_id
                if event.snapshot.is_terminal:  # a duplicate of a task that already ended
                    self._finish(event.snapshot)
                self._unsent.discard(task_id)
                early = self._early.pop(task_id, None)
                if early is not None:
                    self._finish(early)

    def _finish(self, snapshot: TaskSnapshot) -> None:
        """A task's terminal update, once per task id on the stream."""
        if snapshot.task_id not in self._ended:
            self._ended[snapshot.task_id] = None
            if len(self._ended) > ENDED_KEPT:  # the oldest goes: memory stays bounded
                del self._ended[next(iter(self._ended))]
            self._following.discard(snapshot.task_id)
            self._events.append(Finished(snapshot))

    def offer(self, snapshot: TaskSnapshot) -> None:
        with self._lock:
            task_id = snapshot.task_id
            if not snapshot.is_terminal or task_id not in self._following:
                return
            if task_id in self._unsent:
                self._following.discard(task_id)
                self._early[task_id] = snapshot
                return
            self._finish(snapshot)
        self._wake()

    def lose(self, task_id: str, error: WorkerError) -> bool:
        """The worker forgot `task_id`: it ends here as refused. False: the stream goes on."""
        with self._lock:
            if task_id not in self._following:
                return False
            self._following.discard(task_id)
            self._events.append(Refused(task_id, error))
        self._wake()
        return False

    def close(self) -> None:
        with self._lock:
            self.closed = True
        self._wake()

    def take(self) -> list[StreamEvent]:
        with self._lock:
            was_full = self._full()
            events, self._events = self._events, []
            room = was_full and not self._full()
        if room:
            self._room()
        return events

    @property
    def finished(self) -> bool:
        """Nothing more will be sent: closed, or input ended with every task answered and ended."""
        with self._lock:
            if self._events:
                return False
            if self.closed:
                return True
            waiting = self._answers or self._early or self._following
            return self.input_done and self.unanswered == 0 and not waiting


@attrs.define(eq=False)
class _Ending:
    ended: trio.Event = attrs.Factory(trio.Event)
    outcome: TaskSnapshot | WorkerError | None = None
    holds_slot: bool = False


class FedTasks:
    """The tasks a hub fed this node, all on one stream: each one's end, for whoever runs
    its attempt. Everything here happens on the actors' thread, so it takes no lock.

    `expect` a task, submit it (`RunFedTask`) with `answer` as the reply, then wait for
    `ended`; the fan-out offers its terminal update, or says the worker forgot it
    (`lose`). `held` counts the slots the fed tasks hold: it changes in the slot table's
    step that takes or frees the slot, so with the free slots it adds up at any step."""

    every_change = False

    def __init__(self) -> None:
        self._waiting: dict[str, _Ending] = {}
        self.held = 0
        self.abandoned = False
        self.closed = False

    @property
    def task_ids(self) -> Iterable[str]:
        return tuple(self._waiting)

    def expect(self, task_id: str) -> None:
        self._waiting[task_id] = _Ending()

    def answer(self, task_id: str, answer: TaskSnapshot | WorkerError) -> None:
        """The slot table's answer to the task's submit (called in its step)."""
        ending = self._waiting.get(task_id)
        if ending is None or isinstance(answer, WorkerError) or answer.is_terminal:
            return
        ending.holds_slot = True
        self.held += 1

    def give_up(self, task_id: str) -> None:
        """Nobody waits for the task any more (refused, ended, or its runner gone)."""
        ending = self._waiting.pop(task_id, None)
        if ending is not None and ending.holds_slot and ending.outcome is None:
            self.held -= 1

    async def ended(self, task_id: str) -> TaskSnapshot | WorkerError:
        """The task's terminal snapshot, or why the worker cannot give one."""
        ending = self._waiting[task_id]
        await ending.ended.wait()
        assert ending.outcome is not None
        return ending.outcome

    def offer(self, snapshot: TaskSnapshot) -> None:
        if snapshot.is_terminal:
            self._end(snapshot.task_id, snapshot)

    def lose(self, task_id: str, error: WorkerError) -> bool:
        self._end(task_id, error)
        return False

    def _end(self, task_id: str, outcome: TaskSnapshot | WorkerError) -> None:
        ending = self._waiting.get(task_id)
        if ending is not None and ending.outcome is None:
            ending.outcome = outcome
            if ending.holds_slot:
                self.held -= 1
            ending.ended.set()

    def close(self) -> None:
        self.closed = True
