"""Fake clients for the simulation: coordinators at the seam the gRPC handlers use.

A handler of `blockx.api.WorkerService` turns a request into a message with a
reply and posts it to the slot-table actor's inbox; a watch is a
`WatchStream` and a `RunTasks` call a `TaskStream` that the watch fan-out feeds,
ended by an `Unsubscribe` (broken when the client went away). The clients
here do exactly that, without sockets, at random over simulated time:
reserve a slot and submit into it (sometimes after its lease lapsed,
sometimes never), submit inline, submit again (the worker must answer from
what it knows), run tasks on a stream, watch tasks (sometimes going away
before they end, and coming back), and read results and the worker's status.

Judged on the spot: a submit into a live lease is accepted (unless the
worker drains), one past it is refused, a submit again names the same task,
a stream's updates of a task never go back a phase and nothing follows a
terminal update, a watch or stream that ends on its own delivered every
terminal update (and a stream every answer, in order), a task a client saw
accepted is known until its retention ends, and a status agrees with itself.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Awaitable, Callable

import trio

from blockx.actors import (
    Accepted,
    Finished,
    GetResult,
    GetStatus,
    Inbox,
    OpenWatch,
    Refused,
    Reply,
    RequestSlot,
    SlotTableMessage,
    StreamEvent,
    SubmitTask,
    Subscribe,
    TaskStream,
    Unsubscribe,
    WatchStream,
    WorkerStatus,
)
from blockx.calls import CallFailurePolicy, RetryPolicy
from blockx.slots import (
    FunctionCall,
    NotFound,
    ResultHandler,
    SlotState,
    TaskPhase,
    TaskSnapshot,
    TaskSpec,
    Unavailable,
    WorkerError,
)
from tests.sim.executors import SIM_FUNCTION
from tests.sim.world import EPOCH_MS, Fault, TaskRecord, World

MAX_CALLS = 4
THINK_MS = (0, 600)
"""How long a client waits between two requests."""
TTL_CHOICES_MS = (0, 500, 2_000)
RESUBMIT_MARGIN_MS = 1_000
"""A task is submitted again only this long before its result is forgotten, or earlier."""
"""A reservation's TTL (0: the worker's default)."""
_PHASE_ORDER = {
    None: 0,
    TaskPhase.PREPARING: 1,
    TaskPhase.BUILDER: 2,
    TaskPhase.CALLS: 3,
    TaskPhase.PLUGIN: 4,
    TaskPhase.TERMINAL: 5,
}


class _Wake:
    """A watch stream's wake-up: set by the slot-table actor, awaited by the reader."""

    def __init__(self) -> None:
        self._event = trio.Event()

    def set(self) -> None:
        self._event.set()

    async def wait(self) -> None:
        await self._event.wait()
        self._event = trio.Event()


class _StreamReading:
    """What one `RunTasks` stream answered so far, for the checks on it."""

    def __init__(self, world: World, records: list[TaskRecord]) -> None:
        self._world = world
        self._records = records
        self._next = 0
        self.open: set[str] = set()
        """Accepted, not finished yet."""
        self.ended: set[str] = set()

    def answered(self, task_id: str) -> TaskRecord | None:
        """The next submit's answer came: it must be for the next task, in order."""
        if self._next >= len(self._records):
            self._world.violation(f"a stream answered {task_id} after every submit was answered")
            return None
        record = self._records[self._next]
        self._next += 1
        if record.spec.task_id != task_id:
            self._world.violation(f"a stream answered {task_id} for {record.spec.task_id}")
            return None
        return record

    def went_away(self) -> None:
        """The client left: what was not finished on the stream lost its watcher."""
        for record in self._records:
            if record.spec.task_id not in self.ended:
                record.watch_left_ms.append(self._world.now_ms())

    def check_complete(self) -> None:
        """A stream that ended on its own answered every submit and finished every task."""
        if self._next != len(self._records) or self.open:
            unanswered = [r.spec.task_id for r in self._records[self._next :]]
            self._world.violation(
                f"a stream ended with {unanswered} unanswered and {sorted(self.open)} unfinished"
            )


class SimClient:
    """One client; `run` makes requests until `until_ms` or the drain, whichever is first."""

    def __init__(
        self,
        world: World,
        number: int,
        slot_table: Inbox[SlotTableMessage],
        watchers: trio.Nursery,
        *,
        watch_grace_ms: int,
    ) -> None:
        self._world = world
        self._name = f"client-{number}"
        self._slot_table = slot_table
        self._watchers = watchers
        self._watch_grace_ms = watch_grace_ms
        self._made = 0

    async def run(self, until_ms: int) -> None:
        world = self._world
        operations: tuple[tuple[Callable[[], Awaitable[None]], int], ...] = (
            (self.submit_inline, 30),
            (self.reserve_and_submit, 30),
            (self.read_result, 15),
            (self.submit_again, 10),
            (self.watch_some, 15),
            (self.run_tasks, 10),
            (self.read_status, 5),
        )
        total = sum(weight for _, weight in operations)
        while True:
            await world.sleep_ms(world.rng.randint(*THINK_MS))
            if world.now_ms() >= until_ms or world.draining_since_ms is not None:
                return
            pick = world.rng.randrange(total)
            for operation, weight in operations:
                if pick < weight:
                    await operation()
                    break
                pick -= weight

    # ------------------------------------------------------------ operations

    async def submit_inline(self) -> None:
        record = self._new_task()
        if isinstance(await self._submit(record, None), TaskSnapshot):
            self._maybe_watch(record)

    async def reserve_and_submit(self) -> None:
        world = self._world
        record = self._new_task()
        task_id = record.spec.task_id
        ttl_ms = world.rng.choice(TTL_CHOICES_MS)
        reserved = await self._ask(
            "reserve", lambda reply: RequestSlot(task_id=task_id, ttl_ms=ttl_ms, reply=reply)
        )
        if not isinstance(reserved, TaskSnapshot):
            return
        assert reserved.lease_expires_at_ms is not None
        lease_ms = reserved.lease_expires_at_ms - EPOCH_MS
        world.last_lease_ms = max(world.last_lease_ms, lease_ms)
        if world.chance(Fault.LEASE_LAPSE, 0.25):
            if world.rng.random() < 0.5:
                world.record(self._name, "leaves reservation", task_id)
                return
            await world.sleep_ms(lease_ms - world.now_ms() + world.rng.randint(0, 300))
        else:
            await world.sleep_ms(world.rng.randint(0, (lease_ms - world.now_ms()) // 2))
        in_lease = world.now_ms() < lease_ms
        answer = await self._submit(record, reserved.slot_id)
        if isinstance(answer, TaskSnapshot) and not in_lease:
            world.violation(f"{task_id} accepted into its slot after the lease expired")
        refused_in_lease = in_lease and isinstance(answer, WorkerError)
        if refused_in_lease and not isinstance(answer, Unavailable):
            world.violation(f"{task_id} refused within its lease: {answer!r}")
        if isinstance(answer, TaskSnapshot):
            self._maybe_watch(record)

    async def read_result(self) -> None:
        world = self._world
        record = self._pick_task(accepted_only=False)
        if record is None:
            return
        task_id = record.spec.task_id
        # Known to be accepted when asked (a stream may tell of it while the answer comes).
        accepted = record.accepted_ms is not None
        answer = await self._ask("result", lambda reply: GetResult(task_id=task_id, reply=reply))
        if isinstance(answer, TaskSnapshot):
            self._saw(record, answer)
        elif accepted and not world.forgotten(task_id):
            world.violation(f"{task_id} was accepted, yet its result reads {answer!r}")

    async def submit_again(self) -> None:
        world = self._world
        record = self._pick_task(accepted_only=True)
        if record is None or world.forgotten(record.spec.task_id, RESUBMIT_MARGIN_MS):
            return  # once forgotten, the same id is a new task: not what this asks
        answer = await self._submit(record, None)
        if not isinstance(answer, TaskSnapshot) or answer.task_id != record.spec.task_id:
            world.violation(f"{record.spec.task_id} submitted again, answered {answer!r}")

    async def watch_some(self) -> None:
        """Watch tasks this or another client submitted or reserved (or was refused)."""
        world = self._world
        picked = {
            record.spec.task_id
            for _ in range(world.rng.randint(1, 3))
            if (record := self._pick_task(accepted_only=world.rng.random() < 0.8)) is not None
        }
        if picked:
            self._start_watch(tuple(sorted(picked)))

    async def read_status(self) -> None:
        """`GetWorkerStatus`: the figures agree with the slots, the slots with the tasks."""
        status: WorkerStatus = await self._slot_table.ask(lambda reply: GetStatus(reply=reply))
        beat = status.heartbeat
        states = [slot.state for slot in status.slots]
        figures = (beat.slots_total, beat.reserved_slots, beat.running_tasks, beat.free_slots)
        counted = (
            len(states),
            states.count(SlotState.ALLOCATED),
            states.count(SlotState.RUNNING),
            states.count(SlotState.FREE),
        )
        holders = {slot.task_id: slot for slot in status.slots if slot.task_id is not None}
        tasks = {task.task_id: task for task in status.tasks}
        submitted = sum(1 for task in status.tasks if task.phase is not None)
        if figures != counted or holders.keys() != tasks.keys() or beat.active_tasks != submitted:
            self._world.violation(f"a status that disagrees with itself: {status!r}")
        for task_id, task in tasks.items():
            slot = holders[task_id]
            reserved = slot.state is SlotState.ALLOCATED
            shape_ok = (
                task.slot_id == slot.slot_id
                and not task.is_terminal
                and (task.phase in (None, TaskPhase.PREPARING)) == reserved
                and (task.lease_expires_at_ms is not None) == reserved
            )
            if not shape_ok:
                self._world.violation(f"{task_id} holds {slot!r} as {task!r}")

    async def run_tasks(self) -> None:
        """A `RunTasks` stream: submits in, answers and terminal updates out, read as the
        front end reads it; the client may go away from it midway."""
        world = self._world
        records = [self._new_task() for _ in range(world.rng.randint(1, 6))]
        task_ids = [record.spec.task_id for record in records]
        world.record(self._name, "run tasks", *task_ids)
        wake, room = _Wake(), _Wake()
        stream = TaskStream(wake=wake.set, room=room.set, window=world.rng.randint(1, 4))
        self._slot_table.post(Subscribe(stream=stream, snapshots=()))
        reading = _StreamReading(world, records)
        with trio.CancelScope() as scope:
            if world.chance(Fault.WATCH_ABANDON, 0.3):
                scope.deadline = world.trio_time(world.now_ms() + world.rng.randint(0, 3_000))
            async with trio.open_nursery() as feeding:
                feeding.start_soon(self._feed, stream, records, room)
                while not stream.finished:
                    await wake.wait()
                    for event in stream.take():
                        self._on_stream_event(reading, event)
                feeding.cancel_scope.cancel()
        stream.abandoned = True
        self._slot_table.post(Unsubscribe(stream=stream, broken=scope.cancelled_caught))
        if scope.cancelled_caught:
            world.record(self._name, "went away from run tasks")
            reading.went_away()
        else:
            reading.check_complete()

    async def _feed(self, stream: TaskStream, records: list[TaskRecord], room: _Wake) -> None:
        """The stream's requests, at most its window ahead of the answers."""
        world = self._world
        for record in records:
            while stream.full:
                await room.wait()
            if stream.closed:
                return  # the front end answers UNAVAILABLE and ends the call
            place = stream.posted()
            record.answer_unknown = True
            task_id = record.spec.task_id
            reply = functools.partial(stream.answer, place, task_id)
            self._slot_table.post(
                SubmitTask(spec=record.spec, slot_id=None, reply=reply, stream=stream)
            )
            await world.sleep_ms(world.rng.randint(0, 100))
        stream.end_input()

    def _on_stream_event(self, reading: _StreamReading, event: StreamEvent) -> None:
        world = self._world
        match event:
            case Accepted(snapshot=snapshot):
                record = reading.answered(snapshot.task_id)
                if record is not None:
                    record.answer_unknown = False
                    if record.accepted_ms is None:
                        record.accepted_ms = world.now_ms()
                    self._saw(record, snapshot, via="accepted")
                    if not snapshot.is_terminal:
                        reading.open.add(snapshot.task_id)
            case Refused(task_id=task_id, error=error):
                world.record(self._name, "refused", task_id, error.code.value)
                if task_id in reading.open or task_id in reading.ended:
                    world.violation(f"{task_id} was lost from its stream: {error!r}")
                    return
                record = reading.answered(task_id)
                if record is not None:
                    record.answer_unknown = False
                    if not isinstance(error, Unavailable):
                        world.violation(f"{task_id} refused on a stream: {error!r}")
            case Finished(snapshot=snapshot):
                task_id = snapshot.task_id
                if task_id not in reading.open:
                    world.violation(f"{task_id} finished on a stream that did not follow it")
                reading.open.discard(task_id)
                reading.ended.add(task_id)
                self._saw(world.tasks[task_id], snapshot, via="finished")

    # --------------------------------------------------------------- helpers

    def _new_task(self) -> TaskRecord:
        world = self._world
        rng = world.rng
        task_id = f"{self._name}-task-{self._made}"
        self._made += 1
        call_count = rng.randint(0, MAX_CALLS)
        payload = {"calls": [{"function": SIM_FUNCTION, "args": [i]} for i in range(call_count)]}
        retry = RetryPolicy(
            max_attempts=rng.randint(1, 3),
            base_backoff_ms=rng.choice((0, 20, 200)),
            jitter_percent=rng.choice((0, 5)),
            at_most_once=rng.random() < 0.2,
        )
        short_timeout = world.chance(Fault.TASK_TIMEOUT, 0.15)
        plugin_fails = False
        handler = None
        delay_ms = 0
        if rng.random() < 0.6:
            delay_ms = rng.randint(0, 400)
            config: dict[str, object] = {"delay_ms": delay_ms}
            if world.chance(Fault.PLUGIN_FAILURE, 0.2):
                plugin_fails = True
                config.update(fail=True, retryable=rng.random() < 0.5)
            handler = ResultHandler(type="test", config_json=json.dumps(config))
        spec = TaskSpec(
            task_id=task_id,
            function_call=FunctionCall(type="call_list"),
            payload=json.dumps(payload).encode(),
            result_handler=handler,
            task_timeout_ms=rng.randint(50, 1_500) if short_timeout else 0,
            call_failure_policy=rng.choice(tuple(CallFailurePolicy)),
            call_retry_policy=retry,
        )
        record = TaskRecord(
            spec=spec,
            call_count=call_count,
            short_timeout=short_timeout,
            plugin_fails=plugin_fails,
            plugin_delay_ms=delay_ms,
        )
        world.tasks[task_id] = record
        return record

    def _pick_task(self, *, accepted_only: bool) -> TaskRecord | None:
        world = self._world
        records = [
            r for r in world.tasks.values() if r.accepted_ms is not None or not accepted_only
        ]
        return world.rng.choice(records) if records else None

    async def _ask(
        self, what: str, make: Callable[[Reply[TaskSnapshot]], SlotTableMessage]
    ) -> TaskSnapshot | WorkerError:
        try:
            answer = await self._slot_table.ask(make)
        except WorkerError as error:
            self._world.record(self._name, what, "refused", error.code.value)
            return error
        return answer

    async def _submit(self, record: TaskRecord, slot_id: str | None) -> TaskSnapshot | WorkerError:
        spec = record.spec
        answer = await self._ask(
            "submit", lambda reply: SubmitTask(spec=spec, slot_id=slot_id, reply=reply)
        )
        if isinstance(answer, TaskSnapshot):
            if record.accepted_ms is None:
                record.accepted_ms = self._world.now_ms()
            self._saw(record, answer)
        return answer

    def _saw(self, record: TaskRecord, snapshot: TaskSnapshot, via: str = "answer") -> None:
        result = snapshot.result
        code = result.failure_code.value if result and result.failure_code else ""
        phase = snapshot.phase.value if snapshot.phase else ""
        self._world.record(self._name, via, snapshot.task_id, snapshot.state.value, phase, code)
        if snapshot.is_terminal:
            record.terminal_seen.append(snapshot)

    def _maybe_watch(self, record: TaskRecord) -> None:
        if self._world.rng.random() < 0.7:
            self._start_watch((record.spec.task_id,))

    def _start_watch(self, task_ids: tuple[str, ...]) -> None:
        world = self._world
        abandon_after_ms = None
        if world.chance(Fault.WATCH_ABANDON, 0.3):
            abandon_after_ms = world.rng.randint(0, 1_000)
        self._watchers.start_soon(self._watch, task_ids, abandon_after_ms)

    async def _watch(self, task_ids: tuple[str, ...], abandon_after_ms: int | None) -> None:
        """One `WatchTasks` stream, read as the front end reads it."""
        world = self._world
        world.record(self._name, "watch", *task_ids)
        wake = _Wake()
        stream = WatchStream(task_ids, wake=wake.set)
        accepted = {t for t in task_ids if world.tasks[t].accepted_ms is not None}
        self._slot_table.post(OpenWatch(stream=stream))
        phases: dict[str, int] = {}
        with trio.CancelScope() as reading:
            if abandon_after_ms is not None:
                reading.deadline = world.trio_time(world.now_ms() + abandon_after_ms)
            while True:
                await wake.wait()
                for snapshot in stream.take():
                    self._follow(phases, snapshot)
                if stream.error is not None or stream.finished:
                    break
        broken = reading.cancelled_caught or stream.error is not None
        stream.abandoned = True
        self._slot_table.post(Unsubscribe(stream=stream, broken=broken))
        if reading.cancelled_caught:
            await self._went_away(task_ids, phases)
        elif (error := stream.error) is not None:
            world.record(self._name, "watch failed", error.code.value)
            # Unknown is right for a task not known to be accepted when the watch opened
            # (a stream may hold its submit), whose reservation lapsed, or whose result
            # was forgotten after its retention.
            unknown = isinstance(error, NotFound) and (
                error.task_id not in accepted or world.forgotten(error.task_id)
            )
            if not unknown:
                world.violation(f"a watch of {task_ids} failed: {error!r}")
        elif missing := [t for t in task_ids if phases.get(t) != _PHASE_ORDER[TaskPhase.TERMINAL]]:
            world.violation(f"a watch ended without the terminal update of {missing}")

    def _follow(self, phases: dict[str, int], snapshot: TaskSnapshot) -> None:
        """One update on a stream: it never goes back a phase, nothing follows the end."""
        task_id = snapshot.task_id
        order = _PHASE_ORDER[snapshot.phase]
        before = phases.get(task_id, -1)
        if before == _PHASE_ORDER[TaskPhase.TERMINAL] or order < before:
            self._world.violation(f"{task_id} went from phase order {before} to {snapshot!r}")
        phases[task_id] = order
        self._saw(self._world.tasks[task_id], snapshot, via="update")

    async def _went_away(self, task_ids: tuple[str, ...], phases: dict[str, int]) -> None:
        """The client left its watch; it may come back within the grace, or never."""
        world = self._world
        ended = _PHASE_ORDER[TaskPhase.TERMINAL]
        left = tuple(t for t in task_ids if phases.get(t, -1) != ended)
        world.record(self._name, "went away", *left)
        for task_id in left:
            world.tasks[task_id].watch_left_ms.append(world.now_ms())
        if left and world.rng.random() < 0.5:
            back_ms = world.rng.randint(0, math.ceil(self._watch_grace_ms * 1.5))
            await world.sleep_ms(back_ms)
            self._start_watch(left)
