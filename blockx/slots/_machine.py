"""The slot machine: the single source of truth for slots and task state.

Theory of operation
-------------------
The worker owns `task_slots` slots, `slot-0 … slot-(N-1)`, each FREE,
ALLOCATED (reserved under a TTL lease, possibly submitted but not yet
activated) or RUNNING (an activated task). Every task id the machine knows is
in exactly one of two maps:

* `_live`: reserved or submitted and not yet terminal. Each live task holds
  exactly one non-FREE slot and each non-FREE slot is held by exactly one live
  task; both sides change in the same step.
* `_retained`: terminal, its result kept until `result_retention_ms` after it
  ended. The slot was freed in the step that made the result.

Retained results are bounded in bytes too: once their sizes
(`TaskResult.retained_bytes`) add up to more than `result_retention_bytes`, the
oldest are evicted in the step that retained the newest, which always stays
(alone, if it is larger than the bound). An evicted task id is remembered in
`_evicted` until its retention would have ended (at most `evicted_remembered`
of them, the oldest forgotten first), so that a read says it was evicted
rather than unknown; it is no longer known otherwise, and a new task may take
its id. Its purge comes at the same time as if it had stayed.

Rules:

1. One mutator, `handle(event)`. It validates everything first, then
   changes state, and returns a `Step` (a reply and commands). A refused
   request raises a `WorkerError` and changes nothing.
2. Idempotency by task id wins over everything else: a known live task
   answers its snapshot, a retained one its terminal snapshot. Only then do
   readiness, draining, capacity and slot checks apply: nothing is admitted
   while no executor is healthy (`WorkerReady`, before the first and whenever
   all are down) or after `DrainStarted`.
3. Phases go PREPARING → BUILDER → CALLS → PLUGIN → TERMINAL. A report for a
   phase the task is not in (late, duplicated, or for a finished task) is
   ignored. Once submitted, every failure ends as a terminal `TaskResult`.
4. Time only moves through `now_ms` on events. Leases, deadlines, watch grace
   and retention are timers with tickets; re-arming or clearing issues a new
   ticket, so a stale timer does nothing. A lease past its expiry is not
   honoured even before its timer fires (requests get `SlotUncertain`,
   activation fails with `SLOT_LOST`).
5. The machine never reads a clock, draws a random number or does IO.
6. A submitted task may be cancelled from outside (`TaskCancelled`: a hub ended
   the lease of the attempt it runs for): it ends FAILED with the code given,
   like a passed deadline; a cancel of a task that is not live and submitted
   does nothing.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import TypeAlias, assert_never

import attrs

from blockx.calls import CallStats, FailureCode, RetryPolicy
from blockx.errors import Misuse
from blockx.slots._commands import (
    Command,
    ConvergeTask,
    ForgetTask,
    PrepareTaskActivation,
    StartBuilderPhase,
    StartCallPhase,
    StartPhase,
    StartPluginPhase,
)
from blockx.slots._config import SlotConfig
from blockx.slots._errors import (
    InvalidArgument,
    InvalidSlot,
    NoSlot,
    NotFound,
    SlotUncertain,
    Unavailable,
)
from blockx.slots._events import (
    ActivationFailed,
    ActivationPrepared,
    CallsFinished,
    DrainDeadlinePassed,
    DrainStarted,
    Event,
    PhaseFinished,
    SlotRequested,
    TaskCancelled,
    TaskSubmitted,
    TimerFired,
    WatchAttached,
    WatchDetached,
    WatchDisconnected,
    WorkerReady,
)
from blockx.slots._model import (
    MAX_TASK_ID_CHARS,
    RUN_PHASES,
    ForgetReason,
    Heartbeat,
    PhaseTimings,
    PluginResult,
    SlotState,
    SlotView,
    TaskPhase,
    TaskResult,
    TaskSnapshot,
    TaskSpec,
    TaskState,
    Timer,
    TimerKind,
)
from blockx.steps import LoggedStimulus, StimulusLog
from blockx.steps import Step as CoreStep

LAPSED_REMEMBERED = 10_000
"""Lapsed reservations the machine remembers, to say why a late submit into one fails."""
EVICTED_REMEMBERED = 10_000
"""Evicted results whose task ids the machine remembers, to say a read of one was evicted.
Each costs its id and its retention timer, a few hundred bytes: a few MiB at most."""

Step: TypeAlias = CoreStep[TaskSnapshot, Command]
"""For annotations; steps are made with `CoreStep(...)`: calling the parameterized alias
costs a failed attribute write on the frozen instance per step."""
"""What one event produced: the reply for the caller and commands for the runtime."""


@attrs.frozen(kw_only=True)
class _PhaseRule:
    next_phase: TaskPhase
    default_failure: FailureCode
    start_next: Callable[[_Task, str, tuple[bytes, ...]], StartPhase] | None
    """Makes the command that starts `next_phase` (from the task, the stimulus id and
    the outputs of the phase that ended); None when the next is TERMINAL."""


def _start_builder(task: _Task, stimulus_id: str, _outputs: tuple[bytes, ...]) -> StartPhase:
    return StartBuilderPhase(
        task_id=task.task_id, task_code_epoch=task.task_code_epoch, stimulus_id=stimulus_id
    )


def _start_calls(task: _Task, stimulus_id: str, _outputs: tuple[bytes, ...]) -> StartPhase:
    return StartCallPhase(
        task_id=task.task_id,
        call_count=task.call_count,
        streaming=task.streaming,
        stimulus_id=stimulus_id,
    )


def _start_plugin(task: _Task, stimulus_id: str, outputs: tuple[bytes, ...]) -> StartPhase:
    return StartPluginPhase(task_id=task.task_id, outputs=outputs, stimulus_id=stimulus_id)


# Phase progression as data: where a successful end leads and which command
# starts it, and the code a failed one gets when its report names none.
_PHASE_RULES: dict[TaskPhase, _PhaseRule] = {
    TaskPhase.PREPARING: _PhaseRule(
        next_phase=TaskPhase.BUILDER,
        default_failure=FailureCode.ACTIVATION_FAILED,
        start_next=_start_builder,
    ),
    TaskPhase.BUILDER: _PhaseRule(
        next_phase=TaskPhase.CALLS,
        default_failure=FailureCode.BUILDER_FAILED,
        start_next=_start_calls,
    ),
    TaskPhase.CALLS: _PhaseRule(
        next_phase=TaskPhase.PLUGIN,
        default_failure=FailureCode.CALLS_FAILED,
        start_next=_start_plugin,
    ),
    TaskPhase.PLUGIN: _PhaseRule(
        next_phase=TaskPhase.TERMINAL, default_failure=FailureCode.PLUGIN_FAILED, start_next=None
    ),
}
assert tuple(_PHASE_RULES) == RUN_PHASES

_SLOT_MOVES = frozenset(
    {
        (SlotState.FREE, SlotState.ALLOCATED),
        (SlotState.ALLOCATED, SlotState.RUNNING),
        (SlotState.ALLOCATED, SlotState.FREE),
        (SlotState.RUNNING, SlotState.FREE),
    }
)

_ACTIVE_PHASES = RUN_PHASES[1:]
"""The phases of an activated task: its slot is RUNNING."""


@attrs.define
class _Slot:
    slot_id: str
    state: SlotState = SlotState.FREE
    task_id: str | None = None
    lease_expires_at_ms: int | None = None
    lease_ticket: int = 0


@attrs.define
class _Task:
    """A live task id: reserved (`spec` None) or submitted and not terminal."""

    task_id: str
    slot_index: int
    spec: TaskSpec | None = None
    phase: TaskPhase | None = None
    accepted_at_ms: int = 0
    deadline_ms: int | None = None
    deadline_ticket: int = 0
    task_code_epoch: str = ""
    watch_attached: bool = False
    # The last stream broke and none has attached since (a clean detach clears it).
    watch_lost: bool = False
    watch_deadline_ms: int | None = None
    watch_ticket: int = 0
    phase_started_at_ms: int = 0
    phase_ms: dict[TaskPhase, int] = attrs.Factory(dict)
    call_count: int = 0
    streaming: bool = False
    call_stats: CallStats = attrs.Factory(CallStats)
    output_count: int = 0
    output_bytes: int = 0
    plugin_results: tuple[PluginResult, ...] = ()
    # What a phase that succeeded had to say (best effort: which calls failed);
    # the result carries it unless a later phase says more.
    note: str = ""


@attrs.define
class _Retained:
    result: TaskResult
    purge_at_ms: int
    ticket: int
    size: int


class SlotMachine:
    """The slot table and task lifecycle of one worker. See the module docstring."""

    def __init__(self, config: SlotConfig, *, evicted_remembered: int = EVICTED_REMEMBERED) -> None:
        self._config = config
        self._slots = [_Slot(slot_id=f"slot-{i}") for i in range(config.task_slots)]
        self._free = list(range(config.task_slots))
        """Indices of the FREE slots, a heap: the lowest is reserved first."""
        self._slot_index = {slot.slot_id: i for i, slot in enumerate(self._slots)}
        self._live: dict[str, _Task] = {}
        self._retained: OrderedDict[str, _Retained] = OrderedDict()
        """Oldest first: evicted from the front."""
        self._retained_bytes = 0
        self._evicted: OrderedDict[str, int] = OrderedDict()
        """Task id -> the ticket of the retention timer that forgets it, oldest first."""
        self._evicted_remembered = evicted_remembered
        self._ready = False
        self._draining = False
        self._slots_granted = 0
        self._last_ticket = 0
        # Min-heap of (due_ms, ticket, timer); entries whose ticket is no longer
        # current are skipped and dropped lazily.
        self._timers: list[tuple[int, int, Timer]] = []
        self._log = StimulusLog()
        self._lapsed: dict[str, tuple[str, int]] = {}
        """Reservations whose lease expired unused, newest last: task id -> (slot id, expiry
        ms), so a late submit into one is told so (at most `LAPSED_REMEMBERED`)."""

    # ------------------------------------------------------------------ queries

    @property
    def config(self) -> SlotConfig:
        return self._config

    @property
    def ready(self) -> bool:
        return self._ready

    @property
    def draining(self) -> bool:
        return self._draining

    @property
    def recent_stimuli(self) -> tuple[LoggedStimulus, ...]:
        """The last events handled, oldest first, with what came of each."""
        return self._log.recent

    def free_capacity(self) -> int:
        return len(self._free)

    def active_task_count(self) -> int:
        """Submitted tasks that have not reached a terminal state."""
        return sum(1 for task in self._live.values() if task.spec is not None)

    def slot_views(self) -> tuple[SlotView, ...]:
        return tuple(
            SlotView(
                slot_id=slot.slot_id,
                state=slot.state,
                task_id=slot.task_id,
                lease_expires_at_ms=slot.lease_expires_at_ms,
            )
            for slot in self._slots
        )

    def heartbeat(self, now_ms: int) -> Heartbeat:
        reserved = sum(1 for slot in self._slots if slot.state is SlotState.ALLOCATED)
        running = sum(1 for slot in self._slots if slot.state is SlotState.RUNNING)
        return Heartbeat(
            at_ms=now_ms,
            slots_total=len(self._slots),
            reserved_slots=reserved,
            running_tasks=running,
            free_slots=len(self._slots) - reserved - running,
            active_tasks=self.active_task_count(),
            draining=self._draining,
            ready=self._ready,
            slots_granted=self._slots_granted,
        )

    def retained(self) -> tuple[int, int]:
        """The terminal results kept for reads: how many, and their `retained_bytes`."""
        return len(self._retained), self._retained_bytes

    def get_result(self, task_id: str) -> TaskSnapshot:
        """The task's snapshot, with its result once terminal. `NotFound` if unknown,
        `InvalidArgument` for an id no task can have."""
        task = self._live.get(task_id)
        if task is not None:
            return self._snapshot(task)
        retained = self._retained.get(task_id)
        if retained is not None:
            return TaskSnapshot.of_result(retained.result)
        if task_id in self._evicted:
            raise NotFound(task_id=task_id, evicted=True)
        _check_task_id(task_id)  # only here: every known task's id passed it
        raise NotFound(task_id=task_id)

    def get_results(self, task_ids: Sequence[str]) -> tuple[TaskSnapshot, ...]:
        """The snapshots of `task_ids` in order (a watch's). `InvalidArgument` naming the
        first id no task can have, if any; else `NotFound` for the first unknown one."""
        for index, task_id in enumerate(task_ids):
            _check_task_id(task_id, field=f"task_ids[{index}]")
        return tuple(self.get_result(task_id) for task_id in task_ids)

    def next_deadline_ms(self) -> int | None:
        """When the earliest armed timer is due, or None if nothing is armed."""
        self._drop_stale_timers()
        return self._timers[0][0] if self._timers else None

    def due_timers(self, now_ms: int) -> tuple[Timer, ...]:
        """Every current timer due at `now_ms`, earliest first. Arms and fires nothing."""
        due: list[tuple[int, int, Timer]] = []
        while self._timers and self._timers[0][0] <= now_ms:
            entry = heapq.heappop(self._timers)
            if self._is_current(entry[2]):
                due.append(entry)
        for entry in due:
            heapq.heappush(self._timers, entry)
        return tuple(timer for _, _, timer in due)

    # ------------------------------------------------------------------ mutator

    def handle(self, event: Event) -> Step:
        """Apply one event. Raises `WorkerError` (state unchanged) on a refused request."""
        return self._log.apply(event, self._dispatch)

    def _dispatch(self, event: Event) -> Step:
        match event:
            case SlotRequested():
                return self._on_slot_requested(event)
            case TaskSubmitted():
                return self._on_task_submitted(event)
            case ActivationPrepared():
                return self._on_activation_prepared(event)
            case ActivationFailed():
                return self._on_activation_failed(event)
            case PhaseFinished() | CallsFinished():
                return self._on_phase_finished(event)
            case WatchAttached():
                return self._on_watch_attached(event)
            case WatchDetached():
                return self._on_watch_detached(event)
            case WatchDisconnected():
                return self._on_watch_disconnected(event)
            case TimerFired():
                return self._on_timer_fired(event)
            case WorkerReady(ready=ready):
                self._ready = ready
                return CoreStep()
            case DrainStarted():
                self._draining = True
                return CoreStep()
            case DrainDeadlinePassed():
                return self._on_drain_deadline_passed(event)
            case TaskCancelled():
                return self._on_task_cancelled(event)
            case _:
                assert_never(event)

    # --------------------------------------------------------------- admission

    def _on_slot_requested(self, event: SlotRequested) -> Step:
        _check_task_id(event.task_id)
        if not 0 <= event.ttl_ms <= self._config.max_task_timeout_ms:
            raise InvalidArgument(
                field="ttl_ms",
                value=event.ttl_ms,
                allowed=f"between 0 (default TTL) and {self._config.max_task_timeout_ms}",
            )
        known = self._known_reply(event.task_id, event.now_ms)
        if known is not None:
            return CoreStep(reply=known)
        self._check_admitting(event.task_id)
        ttl_ms = event.ttl_ms or self._config.default_ttl_ms
        task = self._reserve(event.task_id, ttl_ms, event.now_ms)
        return CoreStep(reply=self._snapshot(task))

    def _on_task_submitted(self, event: TaskSubmitted) -> Step:
        spec, now_ms = event.spec, event.now_ms
        retry_policy = self._validate_spec(spec)
        task = self._live.get(spec.task_id)
        if task is not None and task.spec is not None:
            return CoreStep(reply=self._snapshot(task))
        retained = self._retained.get(spec.task_id)
        if retained is not None:
            return CoreStep(reply=TaskSnapshot.of_result(retained.result))

        if task is not None:  # reserved by this task id earlier
            slot = self._slots[task.slot_index]
            if event.slot_id is not None and event.slot_id != slot.slot_id:
                raise self._invalid_slot(spec.task_id, event.slot_id)
            self._check_lease_not_passed(task, now_ms)
            self._check_admitting(spec.task_id)
        else:
            if event.slot_id is not None:
                raise self._invalid_slot(spec.task_id, event.slot_id)
            self._check_admitting(spec.task_id)
            task = self._reserve(spec.task_id, self._config.default_ttl_ms, now_ms)

        timeout_ms = spec.task_timeout_ms or self._config.task_deadline_ms
        deadline_ms = now_ms + min(timeout_ms, self._config.max_task_timeout_ms)
        task.spec = spec
        task.phase = TaskPhase.PREPARING
        task.accepted_at_ms = now_ms
        task.phase_started_at_ms = now_ms
        task.deadline_ms = deadline_ms
        task.deadline_ticket = self._arm(TimerKind.TASK_DEADLINE, spec.task_id, deadline_ms)
        if task.watch_lost:
            self._arm_watch_grace(task, now_ms)
        command = PrepareTaskActivation(
            task_id=spec.task_id,
            slot_id=self._slots[task.slot_index].slot_id,
            spec=spec,
            retry_policy=retry_policy,
            deadline_ms=deadline_ms,
            stimulus_id=event.stimulus_id,
        )
        return CoreStep(reply=self._snapshot(task), commands=(command,))

    def _known_reply(self, task_id: str, now_ms: int) -> TaskSnapshot | None:
        task = self._live.get(task_id)
        if task is not None:
            if task.spec is None:
                self._check_lease_not_passed(task, now_ms)
            return self._snapshot(task)
        retained = self._retained.get(task_id)
        if retained is not None:
            return TaskSnapshot.of_result(retained.result)
        return None

    def _check_admitting(self, task_id: str) -> None:
        if self._draining or not self._ready:
            raise Unavailable(task_id=task_id, ready=self._ready)

    def _check_lease_not_passed(self, task: _Task, now_ms: int) -> None:
        slot = self._slots[task.slot_index]
        assert slot.lease_expires_at_ms is not None
        if now_ms >= slot.lease_expires_at_ms:
            raise SlotUncertain(
                task_id=task.task_id,
                slot_id=slot.slot_id,
                lease_expired_at_ms=slot.lease_expires_at_ms,
            )

    def _invalid_slot(self, task_id: str, slot_id: str) -> InvalidSlot:
        index = self._slot_index.get(slot_id)
        held_by = None if index is None else self._slots[index].task_id
        lapsed = self._lapsed.get(task_id)
        return InvalidSlot(
            task_id=task_id,
            slot_id=slot_id,
            held_by=held_by,
            known=index is not None,
            lease_expired_at_ms=lapsed[1] if lapsed and lapsed[0] == slot_id else None,
        )

    def _validate_spec(self, spec: TaskSpec) -> RetryPolicy:
        _check_task_id(spec.task_id)
        limit = self._config.max_task_timeout_ms
        if not 0 <= spec.task_timeout_ms <= limit:
            raise InvalidArgument(
                field="task.task_timeout_ms",
                value=spec.task_timeout_ms,
                allowed=f"between 0 (default deadline) and the maximum {limit}",
            )
        if not spec.function_call.type:
            raise InvalidArgument(
                field="task.function_call.type",
                value=spec.function_call.type,
                allowed="a builder type is required",
            )
        policy = spec.call_retry_policy
        if policy is None:
            return self._config.default_retry_policy
        violation = policy.first_violation()
        if violation is not None:
            attribute, value, allowed = violation
            raise InvalidArgument(
                field=f"task.call_retry_policy.{attribute}", value=value, allowed=allowed
            )
        return policy

    def _reserve(self, task_id: str, ttl_ms: int, now_ms: int) -> _Task:
        if not self._free:
            raise NoSlot(task_id=task_id, task_slots=len(self._slots))
        index = heapq.heappop(self._free)
        slot = self._slots[index]
        self._move_slot(slot, SlotState.ALLOCATED)
        self._slots_granted += 1
        slot.task_id = task_id
        slot.lease_expires_at_ms = now_ms + ttl_ms
        slot.lease_ticket = self._arm(TimerKind.SLOT_LEASE, slot.slot_id, now_ms + ttl_ms)
        task = _Task(task_id=task_id, slot_index=index)
        self._live[task_id] = task
        self._lapsed.pop(task_id, None)
        self._evicted.pop(task_id, None)
        return task

    # -------------------------------------------------------------- activation

    def _on_activation_prepared(self, event: ActivationPrepared) -> Step:
        task = self._live.get(event.task_id)
        if task is None or task.phase is not TaskPhase.PREPARING:
            return CoreStep()
        slot = self._slots[task.slot_index]
        if event.slot_id != slot.slot_id:
            raise Misuse(
                what=f"activation of task {event.task_id!r} reported slot {event.slot_id!r}, "
                f"but the task holds {slot.slot_id!r}"
            )
        assert slot.lease_expires_at_ms is not None
        if event.now_ms >= slot.lease_expires_at_ms:
            return self._end_phase(
                task,
                ok=False,
                failure_code=FailureCode.SLOT_LOST,
                message=f"the lease of {slot.slot_id} expired at "
                f"{slot.lease_expires_at_ms} ms, before activation",
                retryable=True,
                event=event,
            )
        self._move_slot(slot, SlotState.RUNNING)
        slot.lease_expires_at_ms = None
        slot.lease_ticket = 0
        task.task_code_epoch = event.task_code_epoch
        return self._end_phase(task, ok=True, event=event)

    def _on_activation_failed(self, event: ActivationFailed) -> Step:
        task = self._live.get(event.task_id)
        if task is None or task.phase is not TaskPhase.PREPARING:
            return CoreStep()
        return self._end_phase(
            task,
            ok=False,
            failure_code=event.failure_code,
            message=event.message,
            retryable=event.retryable,
            event=event,
        )

    # ------------------------------------------------------------------ phases

    def _on_phase_finished(self, event: PhaseFinished | CallsFinished) -> Step:
        phase = event.phase if isinstance(event, PhaseFinished) else TaskPhase.CALLS
        task = self._live.get(event.task_id)
        if task is None or task.phase is not phase:
            return CoreStep()  # late or out of order: the task has moved on
        outputs: tuple[bytes, ...] = ()
        match event:
            case CallsFinished(outcome=calls):
                task.call_stats = calls.stats
                task.output_count = calls.output_count
                task.output_bytes = calls.output_bytes
                outputs = calls.outputs
            case PhaseFinished(phase=TaskPhase.BUILDER, outcome=built):
                task.call_count = built.call_count
                task.streaming = built.streaming
            case PhaseFinished(outcome=stored):
                task.plugin_results = stored.plugin_results
        outcome = event.outcome
        return self._end_phase(
            task,
            ok=outcome.ok,
            failure_code=outcome.failure_code,
            message=outcome.message,
            retryable=outcome.retryable,
            event=event,
            outputs=outputs,
        )

    def _end_phase(
        self,
        task: _Task,
        *,
        ok: bool,
        event: Event,
        failure_code: FailureCode | None = None,
        message: str = "",
        retryable: bool = False,
        outputs: tuple[bytes, ...] = (),
    ) -> Step:
        """The task's current phase ended: start the next one, or converge."""
        assert task.phase is not None
        rule = _PHASE_RULES[task.phase]
        if not ok:
            return self._converge(
                task,
                TaskState.FAILED,
                event.now_ms,
                event.stimulus_id,
                failure_code=failure_code or rule.default_failure,
                message=message,
                retryable=retryable,
            )
        task.note = message or task.note
        if rule.start_next is None:
            return self._converge(
                task,
                TaskState.SUCCEEDED,
                event.now_ms,
                event.stimulus_id,
                failure_code=None,
                message=task.note,
                retryable=False,
            )
        self._enter_phase(task, rule.next_phase, event.now_ms)
        command = rule.start_next(task, event.stimulus_id, outputs)
        return CoreStep(reply=self._snapshot(task), commands=(command,))

    def _enter_phase(self, task: _Task, phase: TaskPhase, now_ms: int) -> None:
        assert task.phase is not None
        task.phase_ms[task.phase] = now_ms - task.phase_started_at_ms
        task.phase = phase
        task.phase_started_at_ms = now_ms

    # ------------------------------------------------------------------- watch

    def _on_watch_attached(self, event: WatchAttached) -> Step:
        task = self._live.get(event.task_id)
        if task is not None:
            task.watch_attached = True
            task.watch_lost = False
            self._disarm_watch_grace(task)
        return CoreStep()

    def _on_watch_detached(self, event: WatchDetached) -> Step:
        task = self._live.get(event.task_id)
        if task is not None:
            task.watch_attached = False
            task.watch_lost = False
            self._disarm_watch_grace(task)
        return CoreStep()

    def _on_watch_disconnected(self, event: WatchDisconnected) -> Step:
        task = self._live.get(event.task_id)
        if task is not None and task.watch_attached:
            task.watch_attached = False
            task.watch_lost = True
            if task.spec is not None:
                self._arm_watch_grace(task, event.now_ms)
        return CoreStep()

    def _arm_watch_grace(self, task: _Task, now_ms: int) -> None:
        grace_ms = self._config.watch_disconnect_grace_ms
        if grace_ms > 0:
            task.watch_deadline_ms = now_ms + grace_ms
            task.watch_ticket = self._arm(TimerKind.WATCH_GRACE, task.task_id, now_ms + grace_ms)

    def _disarm_watch_grace(self, task: _Task) -> None:
        task.watch_deadline_ms = None
        task.watch_ticket = 0

    # ------------------------------------------------------------------ timers

    def _arm(self, kind: TimerKind, key: str, due_ms: int) -> int:
        self._last_ticket += 1
        timer = Timer(kind=kind, key=key, ticket=self._last_ticket, due_ms=due_ms)
        heapq.heappush(self._timers, (due_ms, timer.ticket, timer))
        return timer.ticket

    def _is_current(self, timer: Timer) -> bool:
        match timer.kind:
            case TimerKind.SLOT_LEASE:
                index = self._slot_index.get(timer.key)
                return index is not None and self._slots[index].lease_ticket == timer.ticket
            case TimerKind.TASK_DEADLINE:
                task = self._live.get(timer.key)
                return task is not None and task.deadline_ticket == timer.ticket
            case TimerKind.WATCH_GRACE:
                task = self._live.get(timer.key)
                return task is not None and task.watch_ticket == timer.ticket
            case TimerKind.RESULT_RETENTION:
                retained = self._retained.get(timer.key)
                if retained is None:
                    return self._evicted.get(timer.key) == timer.ticket
                return retained.ticket == timer.ticket
            case _:
                assert_never(timer.kind)

    def _drop_stale_timers(self) -> None:
        while self._timers and not self._is_current(self._timers[0][2]):
            heapq.heappop(self._timers)
        # Stale entries deeper in the heap are dropped once they clearly
        # outnumber what can be armed (a lease per slot, a deadline and a watch
        # grace per live task, a retention per result kept or evicted), so
        # re-arming cannot grow the heap without bound.
        armable = len(self._slots) + 2 * len(self._live) + len(self._retained) + len(self._evicted)
        if len(self._timers) > 4 * armable + 64:
            self._timers = [entry for entry in self._timers if self._is_current(entry[2])]
            heapq.heapify(self._timers)

    def _on_timer_fired(self, event: TimerFired) -> Step:
        timer, now_ms = event.timer, event.now_ms
        if now_ms < timer.due_ms or not self._is_current(timer):
            return CoreStep()  # early, or stale: whatever armed it has moved on
        match timer.kind:
            case TimerKind.SLOT_LEASE:
                return self._on_lease_expired(self._slots[self._slot_index[timer.key]], event)
            case TimerKind.TASK_DEADLINE:
                task = self._live[timer.key]
                return self._converge(
                    task,
                    TaskState.FAILED,
                    now_ms,
                    event.stimulus_id,
                    failure_code=FailureCode.TIMED_OUT,
                    message=f"task deadline {task.deadline_ms} ms passed",
                    retryable=True,
                )
            case TimerKind.WATCH_GRACE:
                return self._converge(
                    self._live[timer.key],
                    TaskState.FAILED,
                    now_ms,
                    event.stimulus_id,
                    failure_code=FailureCode.WATCH_DISCONNECTED,
                    message=f"no watcher reattached within "
                    f"{self._config.watch_disconnect_grace_ms} ms",
                    retryable=False,
                )
            case TimerKind.RESULT_RETENTION:
                retained = self._retained.pop(timer.key, None)
                if retained is None:  # evicted earlier: now forgotten for good
                    del self._evicted[timer.key]
                else:
                    self._retained_bytes -= retained.size
                forget = ForgetTask(
                    task_id=timer.key,
                    reason=ForgetReason.RESULT_PURGED,
                    stimulus_id=event.stimulus_id,
                )
                return CoreStep(commands=(forget,))
            case _:
                assert_never(timer.kind)

    def _on_lease_expired(self, slot: _Slot, event: TimerFired) -> Step:
        assert slot.task_id is not None
        task = self._live[slot.task_id]
        if task.spec is not None:  # submitted, lease lapsed before activation
            return self._converge(
                task,
                TaskState.FAILED,
                event.now_ms,
                event.stimulus_id,
                failure_code=FailureCode.SLOT_LOST,
                message=f"the lease of {slot.slot_id} expired before activation",
                retryable=True,
            )
        assert slot.lease_expires_at_ms is not None
        self._lapsed[task.task_id] = (slot.slot_id, slot.lease_expires_at_ms)
        if len(self._lapsed) > LAPSED_REMEMBERED:
            del self._lapsed[next(iter(self._lapsed))]
        self._release(task)
        forget = ForgetTask(
            task_id=task.task_id, reason=ForgetReason.LEASE_EXPIRED, stimulus_id=event.stimulus_id
        )
        return CoreStep(commands=(forget,))

    def _on_drain_deadline_passed(self, event: DrainDeadlinePassed) -> Step:
        self._draining = True
        commands: list[Command] = []
        for task in list(self._live.values()):
            if task.spec is None:
                self._release(task)
                commands.append(
                    ForgetTask(
                        task_id=task.task_id,
                        reason=ForgetReason.WORKER_SHUTDOWN,
                        stimulus_id=event.stimulus_id,
                    )
                )
            else:
                commands.extend(
                    self._converge(
                        task,
                        TaskState.FAILED,
                        event.now_ms,
                        event.stimulus_id,
                        failure_code=FailureCode.WORKER_SHUTDOWN,
                        message="the worker shut down before the task finished",
                        retryable=True,
                    ).commands
                )
        return CoreStep(commands=tuple(commands))

    def _on_task_cancelled(self, event: TaskCancelled) -> Step:
        task = self._live.get(event.task_id)
        if task is None or task.spec is None:
            return CoreStep()  # ended already, unknown, or only reserved: nothing runs
        return self._converge(
            task,
            TaskState.FAILED,
            event.now_ms,
            event.stimulus_id,
            failure_code=event.failure_code,
            message=event.message,
            retryable=True,
        )

    # ------------------------------------------------------------ convergence

    def _converge(
        self,
        task: _Task,
        state: TaskState,
        now_ms: int,
        stimulus_id: str,
        *,
        failure_code: FailureCode | None,
        message: str,
        retryable: bool,
    ) -> Step:
        """End a submitted task: record the result and free its slot in one step."""
        assert task.phase is not None
        ended_in = task.phase
        task.phase_ms[ended_in] = now_ms - task.phase_started_at_ms
        slot_id = self._slots[task.slot_index].slot_id
        result = TaskResult(
            task_id=task.task_id,
            slot_id=slot_id,
            state=state,
            phase=ended_in,
            failure_code=failure_code,
            message=message,
            retryable=retryable,
            output_count=task.output_count,
            output_bytes=task.output_bytes,
            plugin_results=task.plugin_results,
            call_stats=task.call_stats,
            timings=PhaseTimings.of(task.phase_ms, total_ms=now_ms - task.accepted_at_ms),
            task_code_epoch=task.task_code_epoch,
            accepted_at_ms=task.accepted_at_ms,
            finished_at_ms=now_ms,
        )
        self._release(task)
        self._retain(result, now_ms)
        command = ConvergeTask(task_id=task.task_id, result=result, stimulus_id=stimulus_id)
        return CoreStep(
            reply=TaskSnapshot.of_result(result), commands=(command, *self._evict(stimulus_id))
        )

    def _retain(self, result: TaskResult, now_ms: int) -> None:
        purge_at_ms = now_ms + self._config.result_retention_ms
        size = result.retained_bytes
        self._retained[result.task_id] = _Retained(
            result=result,
            purge_at_ms=purge_at_ms,
            ticket=self._arm(TimerKind.RESULT_RETENTION, result.task_id, purge_at_ms),
            size=size,
        )
        self._retained_bytes += size

    def _evict(self, stimulus_id: str) -> list[Command]:
        """Evict the oldest results, keeping the newest, until the rest fit the bound."""
        forgets: list[Command] = []
        while (
            self._retained_bytes > self._config.result_retention_bytes and len(self._retained) > 1
        ):
            task_id, retained = self._retained.popitem(last=False)
            self._retained_bytes -= retained.size
            self._evicted[task_id] = retained.ticket
            if len(self._evicted) > self._evicted_remembered:
                self._evicted.popitem(last=False)
            forgets.append(
                ForgetTask(
                    task_id=task_id, reason=ForgetReason.RESULT_EVICTED, stimulus_id=stimulus_id
                )
            )
        return forgets

    def _release(self, task: _Task) -> None:
        """Free the task's slot and forget the live entry (timers go stale with it)."""
        slot = self._slots[task.slot_index]
        self._move_slot(slot, SlotState.FREE)
        heapq.heappush(self._free, task.slot_index)
        slot.task_id = None
        slot.lease_expires_at_ms = None
        slot.lease_ticket = 0
        del self._live[task.task_id]

    def _move_slot(self, slot: _Slot, to: SlotState) -> None:
        if (slot.state, to) not in _SLOT_MOVES:
            raise Misuse(what=f"{slot.slot_id}: {slot.state.value} -> {to.value}")
        slot.state = to

    # --------------------------------------------------------------- snapshots

    def _snapshot(self, task: _Task) -> TaskSnapshot:
        slot = self._slots[task.slot_index]
        return TaskSnapshot(
            task_id=task.task_id,
            slot_id=slot.slot_id,
            state=TaskState.ALLOCATED if task.spec is None else TaskState.RUNNING,
            phase=task.phase,
            lease_expires_at_ms=slot.lease_expires_at_ms,
            deadline_ms=task.deadline_ms,
        )

    # -------------------------------------------------------------- invariants

    def check_invariants(self) -> None:
        """Raise AssertionError if any rule of the module docstring is broken."""
        assert len(self._slots) == self._config.task_slots
        assert not (self._live.keys() & self._retained.keys()), "task both live and retained"
        held: dict[str, int] = {}
        for index, slot in enumerate(self._slots):
            assert slot.slot_id == f"slot-{index}"
            if slot.state is SlotState.FREE:
                assert slot.task_id is None, f"{slot.slot_id} free but held"
                assert slot.lease_expires_at_ms is None
                assert slot.lease_ticket == 0
                continue
            assert slot.task_id is not None, f"{slot.slot_id} {slot.state} without a task"
            assert slot.task_id not in held, f"{slot.task_id} holds two slots"
            held[slot.task_id] = index
            task = self._live.get(slot.task_id)
            assert task is not None, f"{slot.slot_id} held by unknown {slot.task_id}"
            assert task.slot_index == index
            if slot.state is SlotState.ALLOCATED:
                assert task.phase in (None, TaskPhase.PREPARING)
                assert slot.lease_expires_at_ms is not None
                assert slot.lease_ticket > 0
            else:
                assert task.phase in _ACTIVE_PHASES
                assert slot.lease_expires_at_ms is None
                assert slot.lease_ticket == 0
        assert held.keys() == self._live.keys(), "live task without a slot"
        free = [i for i, slot in enumerate(self._slots) if slot.state is SlotState.FREE]
        assert sorted(self._free) == free, "the free-slot heap differs from the FREE slots"
        for task in self._live.values():
            submitted = task.spec is not None
            assert submitted == (task.phase is not None)
            assert submitted == (task.deadline_ms is not None) == (task.deadline_ticket > 0)
            if task.watch_ticket:
                assert submitted
                assert not task.watch_attached
                assert task.watch_lost
                assert task.watch_deadline_ms is not None
            else:
                assert task.watch_deadline_ms is None
        for task_id, retained in self._retained.items():
            assert retained.result.task_id == task_id
            assert retained.result.state.is_terminal
            assert retained.ticket > 0
            assert retained.size == retained.result.retained_bytes
        self._check_retention_bounds()
        heap_tickets = {ticket for _, ticket, _ in self._timers}
        for slot in self._slots:
            assert not slot.lease_ticket or slot.lease_ticket in heap_tickets
        for task in self._live.values():
            assert not task.deadline_ticket or task.deadline_ticket in heap_tickets
            assert not task.watch_ticket or task.watch_ticket in heap_tickets
        for retained in self._retained.values():
            assert retained.ticket in heap_tickets
        assert heap_tickets.issuperset(self._evicted.values()), "evicted id never forgotten"

    def _check_retention_bounds(self) -> None:
        retained_bytes = sum(retained.size for retained in self._retained.values())
        assert retained_bytes == self._retained_bytes, "retained bytes miscounted"
        assert retained_bytes <= self._config.result_retention_bytes or len(self._retained) == 1
        assert not (self._evicted.keys() & (self._live.keys() | self._retained.keys()))
        assert len(self._evicted) <= self._evicted_remembered


def _check_task_id(task_id: str, *, field: str = "task_id") -> None:
    if not task_id or task_id.strip() != task_id or len(task_id) > MAX_TASK_ID_CHARS:
        raise InvalidArgument(
            field=field,
            value=task_id,
            allowed=f"a non-empty id of at most {MAX_TASK_ID_CHARS} characters "
            "without leading or trailing whitespace",
        )
