"""Hypothesis state machine over `SlotMachine`, checked against `SlotModel`.

Rules are the things that happen to a worker (clients reserve and submit,
task runtimes report, watchers come and go, the worker drains, time passes);
invariants are the guarantees the slot table gives whatever happens.
"""

from __future__ import annotations

import collections
import itertools

import hypothesis.strategies as st
from hypothesis import note
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from blockx.calls import CallPhaseOutcome, FailureCode, RetryPolicy
from blockx.slots import (
    RUN_PHASES,
    ActivationFailed,
    ActivationPrepared,
    CallsFinished,
    Command,
    ConvergeTask,
    DrainDeadlinePassed,
    DrainStarted,
    Event,
    ForgetTask,
    FunctionCall,
    NotFound,
    PhaseFinished,
    PhaseOutcome,
    PrepareTaskActivation,
    SlotConfig,
    SlotMachine,
    SlotRequested,
    SlotState,
    Step,
    TaskCancelled,
    TaskPhase,
    TaskResult,
    TaskSnapshot,
    TaskSpec,
    TaskSubmitted,
    Timer,
    TimerFired,
    TimerKind,
    WatchAttached,
    WatchDetached,
    WatchDisconnected,
    WorkerError,
    WorkerReady,
)
from blockx.steps import RECENT_STIMULI
from tests.property.slot_model import (
    Prediction,
    SlotModel,
    is_eviction,
    normalise_command,
    normalise_step,
)

ALL_TASK_IDS = [f"t{i}" for i in range(4)]
TASK_IDS = st.sampled_from(ALL_TASK_IDS)
REPORTABLE_PHASES = (TaskPhase.BUILDER, TaskPhase.CALLS, TaskPhase.PLUGIN)
REPORTED_PHASES = st.sampled_from(REPORTABLE_PHASES)
MAX_TIMEOUT_MS = 5_000
CALL_OUTPUTS = st.lists(st.binary(max_size=4), max_size=3).map(tuple)


class SlotTable(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = 0
        self.stimuli = itertools.count()
        self.prepared: set[str] = set()
        self.results: dict[str, tuple[TaskResult, int]] = {}
        self.seen_timers: list[Timer] = []
        # Every event fed to the machine, as far back as its stimulus log reaches.
        self.fed: collections.deque[Event] = collections.deque(maxlen=RECENT_STIMULI)

    @initialize(
        task_slots=st.integers(1, 4),
        default_ttl_ms=st.sampled_from([150, 1_000]),
        retention_ms=st.sampled_from([0, 400, 3_000]),
        retention_bytes=st.sampled_from([1, 300, 300, 500, 10**9]),
        grace_ms=st.sampled_from([0, 300, 1_500]),
    )
    def boot(
        self,
        task_slots: int,
        default_ttl_ms: int,
        retention_ms: int,
        retention_bytes: int,
        grace_ms: int,
    ) -> None:
        self.config = SlotConfig(
            task_slots=task_slots,
            default_ttl_ms=default_ttl_ms,
            task_deadline_ms=2_000,
            max_task_timeout_ms=MAX_TIMEOUT_MS,
            result_retention_ms=retention_ms,
            result_retention_bytes=retention_bytes,
            watch_disconnect_grace_ms=grace_ms,
            default_retry_policy=RetryPolicy(max_attempts=3, base_backoff_ms=10, jitter_percent=5),
        )
        self.machine = SlotMachine(self.config)
        self.model = SlotModel(self.config)
        self.granted_seen = 0
        self.live_seen: set[str] = set()

    # ----------------------------------------------------------------- driving

    def _stimulus(self) -> str:
        return f"s{next(self.stimuli)}"

    def _handle(self, event: Event) -> Step:
        """Feed one event to the machine; every command it answers with carries its id."""
        self.fed.append(event)
        step = self.machine.handle(event)
        for command in step.commands:
            assert command.stimulus_id == event.stimulus_id, (
                f"{command!r} caused by {event.stimulus_id!r}"
            )
        return step

    def _apply(self, event: Event, expected: Prediction) -> Step | None:
        """Feed one event, compare with the model's prediction, track guarantees."""
        note(f"{event!r} -> expected {expected!r}")
        try:
            step = self._handle(event)
        except WorkerError as exc:
            refused: WorkerError | None = exc
        else:
            refused = None
        if refused is not None:
            assert expected.error is type(refused), f"got {refused!r}, expected {expected}"
            return None
        assert expected.error is None, f"expected {expected.error}, got {step!r}"
        assert normalise_step(step) == expected, f"got {normalise_step(step)}"
        self._track(step.commands)
        return step

    def _track(self, commands: tuple[Command, ...]) -> None:
        """Follow one step's commands; tell the model each new result's size and check
        that the step evicted what the model's rule evicts, in the same order."""
        evicted = [normalise_command(command) for command in commands if is_eviction(command)]
        expected: list[object] = []
        for command in commands:
            if isinstance(command, ConvergeTask):
                expected.extend(self.model.retain(command.task_id, command.result.retained_bytes))
        assert evicted == expected, f"evicted {evicted}, the model evicts {expected}"
        for command in commands:
            match command:
                case PrepareTaskActivation(task_id=task_id):
                    assert not self.machine.draining, "admitted work while draining"
                    assert self.machine.ready, "admitted work before it was ready"
                    assert task_id not in self.prepared, f"{task_id} started twice"
                    self.prepared.add(task_id)
                case ConvergeTask(task_id=task_id, result=result):
                    assert task_id not in self.results, f"{task_id} converged twice"
                    until = result.finished_at_ms + self.config.result_retention_ms
                    self.results[task_id] = (result, until)
                case ForgetTask(task_id=task_id):
                    self.prepared.discard(task_id)
                    self.results.pop(task_id, None)

    def _pick(self, data: st.DataObject, candidates: list[str]) -> str:
        """Mostly one of `candidates` (tasks the rule can move on), sometimes any id."""
        if candidates and data.draw(st.integers(0, 4), label="targeted") > 0:
            return data.draw(st.sampled_from(sorted(candidates)), label="task_id")
        return data.draw(TASK_IDS, label="task_id")

    def _model_ids(self, *phases: TaskPhase | None) -> list[str]:
        return [task_id for task_id, task in self.model.live.items() if task.phase in phases]

    def _slot_of(self, task_id: str) -> str | None:
        for view in self.machine.slot_views():
            if view.task_id == task_id:
                return view.slot_id
        return None

    def _scan(self) -> None:
        """What the runtime's timer actor does: fire every due timer.

        The model fires its timers in step with the machine, so that it learns the sizes
        of the results each one made before the next: a timer that acts is the model's
        earliest due one; one made stale earlier in the scan does nothing."""
        expected: list[tuple[object, ...]] = []
        got: list[tuple[object, ...]] = []
        while (due := self.machine.next_deadline_ms()) is not None and due <= self.now:
            timers = self.machine.due_timers(self.now)
            assert timers, "next_deadline_ms is due but no timer is"
            self.seen_timers.extend(timers)
            for timer in timers:
                step = self._handle(
                    TimerFired(timer=timer, now_ms=self.now, stimulus_id=self._stimulus())
                )
                if step.commands:
                    expected.extend(self.model.fire_next(self.now))
                self._track(step.commands)
                got.extend(normalise_step(step).commands)
        assert self.model.fire_next(self.now) == (), f"the model has timers due at {self.now}"
        assert got == expected, f"scan at {self.now}: got {got}, expected {expected}"
        due = self.machine.next_deadline_ms()
        assert due is None or due > self.now, "a timer is still due after the scan"
        assert due == self.model.next_due()

    # ------------------------------------------------------------------- rules

    @rule(task_id=TASK_IDS, ttl_ms=st.sampled_from([0, 0, 100, 1_200, -5, MAX_TIMEOUT_MS + 1]))
    def reserve_slot(self, task_id: str, ttl_ms: int) -> None:
        expected = self.model.request_slot(task_id, ttl_ms, self.now)
        event = SlotRequested(
            task_id=task_id, ttl_ms=ttl_ms, now_ms=self.now, stimulus_id=self._stimulus()
        )
        self._apply(event, expected)

    @rule(
        data=st.data(),
        slot_choice=st.sampled_from(["none", "none", "own", "own", "slot-0", "slot-1", "slot-4"]),
        timeout_ms=st.sampled_from([0, 0, 300, 1_500, -1, MAX_TIMEOUT_MS + 1]),
    )
    def submit_task(self, data: st.DataObject, slot_choice: str, timeout_ms: int) -> None:
        task_id = self._pick(data, self._model_ids(None))
        own = self._slot_of(task_id)
        slot_id: str | None
        if slot_choice == "none":
            slot_id = None
        elif slot_choice == "own":
            slot_id = own or "slot-0"
        else:
            slot_id = slot_choice
        expected = self.model.submit(
            task_id,
            slot_given=slot_id is not None,
            own_slot=slot_id is not None and slot_id == own,
            timeout_ms=timeout_ms,
            now=self.now,
        )
        spec = TaskSpec(
            task_id=task_id,
            function_call=FunctionCall(type="static"),
            task_timeout_ms=timeout_ms,
        )
        event = TaskSubmitted(
            spec=spec, slot_id=slot_id, now_ms=self.now, stimulus_id=self._stimulus()
        )
        self._apply(event, expected)

    def _report_activation(self, task_id: str, epoch: str) -> None:
        expected = self.model.activate(task_id, self.now)
        event = ActivationPrepared(
            task_id=task_id,
            slot_id=self._slot_of(task_id) or "slot-0",
            task_code_epoch=epoch,
            now_ms=self.now,
            stimulus_id=self._stimulus(),
        )
        self._apply(event, expected)

    def _report_phase(
        self,
        task_id: str,
        phase: TaskPhase,
        *,
        ok: bool,
        code: FailureCode | None,
        retryable: bool,
        outputs: tuple[bytes, ...],
    ) -> None:
        """Report the end of `phase` as a task runtime does (the calls phase: CallsFinished)."""
        failure_code = None if ok else code
        event: PhaseFinished | CallsFinished
        if phase is TaskPhase.CALLS:
            expected = self.model.finish_phase(
                task_id,
                phase,
                ok=ok,
                code=code,
                retryable=retryable,
                now=self.now,
                outputs=outputs,
            )
            event = CallsFinished(
                task_id=task_id,
                outcome=CallPhaseOutcome(
                    ok=ok, failure_code=failure_code, retryable=retryable, outputs=outputs
                ),
                now_ms=self.now,
                stimulus_id=self._stimulus(),
            )
        else:
            expected = self.model.finish_phase(
                task_id, phase, ok=ok, code=code, retryable=retryable, now=self.now
            )
            event = PhaseFinished(
                task_id=task_id,
                phase=phase,
                outcome=PhaseOutcome(ok=ok, failure_code=failure_code, retryable=retryable),
                now_ms=self.now,
                stimulus_id=self._stimulus(),
            )
        self._apply(event, expected)

    @rule(data=st.data(), epoch=st.sampled_from(["e1", "e2"]))
    def activate_task(self, data: st.DataObject, epoch: str) -> None:
        task_id = self._pick(data, self._model_ids(TaskPhase.PREPARING))
        self._report_activation(task_id, epoch)

    @rule(
        data=st.data(),
        code=st.sampled_from([FailureCode.ACTIVATION_FAILED, FailureCode.IO_SCOPE_FAILED, None]),
        retryable=st.booleans(),
    )
    def fail_activation(
        self, data: st.DataObject, code: FailureCode | None, retryable: bool
    ) -> None:
        task_id = self._pick(data, self._model_ids(TaskPhase.PREPARING))
        expected = self.model.fail_activation(task_id, code, retryable, self.now)
        event = ActivationFailed(
            task_id=task_id,
            failure_code=code,
            message="pin failed",
            retryable=retryable,
            now_ms=self.now,
            stimulus_id=self._stimulus(),
        )
        self._apply(event, expected)

    @rule(
        data=st.data(),
        ok=st.sampled_from([True, True, True, False]),
        code=st.sampled_from([None, FailureCode.BUILDER_NOT_FOUND, FailureCode.CALL_RAISED]),
        retryable=st.booleans(),
        outputs=CALL_OUTPUTS,
    )
    def finish_phase(
        self,
        data: st.DataObject,
        ok: bool,
        code: FailureCode | None,
        retryable: bool,
        outputs: tuple[bytes, ...],
    ) -> None:
        """A task runtime reports the end of a phase, maybe not the one the task is in."""
        task_id = self._pick(
            data, self._model_ids(TaskPhase.BUILDER, TaskPhase.CALLS, TaskPhase.PLUGIN)
        )
        task = self.model.live.get(task_id)
        current = None if task is None else task.phase
        if current in REPORTABLE_PHASES and data.draw(st.booleans(), label="in_order"):
            phase = current
        else:
            phase = data.draw(REPORTED_PHASES, label="phase")
        self._report_phase(task_id, phase, ok=ok, code=code, retryable=retryable, outputs=outputs)

    @rule(data=st.data(), reports=st.integers(1, 4), outputs=CALL_OUTPUTS)
    def runtime_reports_in_order(
        self, data: st.DataObject, reports: int, outputs: tuple[bytes, ...]
    ) -> None:
        """A healthy task runtime reports success of each phase in turn, without delay.

        Reaches the later phases (and their successful end) far more often than
        the rules above, whose reports mostly come out of order or late.
        """
        task_id = self._pick(data, self._model_ids(*RUN_PHASES))
        for _ in range(reports):
            task = self.model.live.get(task_id)
            phase = None if task is None else task.phase
            if phase is TaskPhase.PREPARING:
                self._report_activation(task_id, "e1")
            elif phase in REPORTABLE_PHASES:
                self._report_phase(
                    task_id, phase, ok=True, code=None, retryable=False, outputs=outputs
                )
            else:
                return

    @rule(task_id=TASK_IDS, outputs=CALL_OUTPUTS, calls_ok=st.booleans())
    def task_runs_to_its_end(
        self, task_id: str, outputs: tuple[bytes, ...], calls_ok: bool
    ) -> None:
        """A task submitted and run through without a pause: results come often enough
        for the byte bound to evict some in most runs."""
        expected = self.model.submit(
            task_id, slot_given=False, own_slot=False, timeout_ms=0, now=self.now
        )
        spec = TaskSpec(task_id=task_id, function_call=FunctionCall(type="static"))
        event = TaskSubmitted(
            spec=spec, slot_id=None, now_ms=self.now, stimulus_id=self._stimulus()
        )
        self._apply(event, expected)
        self._report_activation(task_id, "e1")
        for phase in REPORTABLE_PHASES:
            task = self.model.live.get(task_id)
            if task is None or task.phase is not phase:
                return
            ok = calls_ok or phase is not TaskPhase.CALLS
            self._report_phase(task_id, phase, ok=ok, code=None, retryable=False, outputs=outputs)

    @rule(data=st.data())
    def attach_watch(self, data: st.DataObject) -> None:
        task_id = self._pick(data, list(self.model.live))
        self.model.watch_attached(task_id)
        event = WatchAttached(task_id=task_id, now_ms=self.now, stimulus_id=self._stimulus())
        self._apply(event, Prediction())

    @rule(data=st.data())
    def detach_watch(self, data: st.DataObject) -> None:
        task_id = self._pick(data, list(self.model.live))
        self.model.watch_detached(task_id)
        event = WatchDetached(task_id=task_id, now_ms=self.now, stimulus_id=self._stimulus())
        self._apply(event, Prediction())

    @rule(data=st.data())
    def lose_watch(self, data: st.DataObject) -> None:
        task_id = self._pick(data, list(self.model.live))
        self.model.watch_disconnected(task_id, self.now)
        event = WatchDisconnected(task_id=task_id, now_ms=self.now, stimulus_id=self._stimulus())
        self._apply(event, Prediction())

    @rule(data=st.data(), ending=st.sampled_from(["detach", "attach", "stay lost"]))
    def watcher_flaps(self, data: st.DataObject, ending: str) -> None:
        """A watcher attaches, its stream breaks, then it detaches, comes back or not."""
        task_id = self._pick(data, list(self.model.live))
        steps: list[tuple[type[WatchAttached | WatchDetached | WatchDisconnected], str]] = [
            (WatchAttached, "attach"),
            (WatchDisconnected, "lose"),
        ]
        if ending == "detach":
            steps.append((WatchDetached, "detach"))
        elif ending == "attach":
            steps.append((WatchAttached, "attach"))
        for event_type, verb in steps:
            match verb:
                case "attach":
                    self.model.watch_attached(task_id)
                case "lose":
                    self.model.watch_disconnected(task_id, self.now)
                case _:
                    self.model.watch_detached(task_id)
            event = event_type(task_id=task_id, now_ms=self.now, stimulus_id=self._stimulus())
            self._apply(event, Prediction())

    @rule()
    def readiness_changes(self) -> None:
        """Executors come and go: readiness flips (the first flip is the first executor)."""
        self.model.ready = not self.model.ready
        event = WorkerReady(now_ms=self.now, stimulus_id=self._stimulus(), ready=self.model.ready)
        self._apply(event, Prediction())

    @rule()
    def start_drain(self) -> None:
        self.model.draining = True
        self._apply(DrainStarted(now_ms=self.now, stimulus_id=self._stimulus()), Prediction())

    @precondition(lambda self: self.machine.draining)
    @rule()
    def pass_drain_deadline(self) -> None:
        expected = self.model.drain_deadline_passed(self.now)
        self._apply(DrainDeadlinePassed(now_ms=self.now, stimulus_id=self._stimulus()), expected)
        assert self.machine.active_task_count() == 0

    @rule(data=st.data())
    def cancel_task(self, data: st.DataObject) -> None:
        task_id = self._pick(data, self._model_ids(*RUN_PHASES, TaskPhase.PREPARING))
        expected = self.model.cancel(task_id, FailureCode.LEASE_LOST, self.now)
        event = TaskCancelled(
            task_id=task_id,
            failure_code=FailureCode.LEASE_LOST,
            message="the hub ended the attempt's lease",
            now_ms=self.now,
            stimulus_id=self._stimulus(),
        )
        self._apply(event, expected)
        snapshot = self._every_snapshot()[task_id]
        assert snapshot is None or snapshot.is_terminal or snapshot.phase is None, snapshot

    @rule(elapsed_ms=st.integers(1, 2_500))
    def advance_clock_and_scan(self, elapsed_ms: int) -> None:
        self.now += elapsed_ms
        self._scan()
        for view in self.machine.slot_views():
            if view.task_id is not None:
                snapshot = self.machine.get_result(view.task_id)
                assert snapshot.deadline_ms is None or snapshot.deadline_ms > self.now
                assert (
                    snapshot.lease_expires_at_ms is None or snapshot.lease_expires_at_ms > self.now
                )

    @rule(elapsed_ms=st.integers(1, 1_200))
    def advance_clock_without_scan(self, elapsed_ms: int) -> None:
        """Time passes but the timers are not fed back yet (a busy runtime)."""
        self.now += elapsed_ms

    @precondition(lambda self: self.seen_timers)
    @rule(data=st.data())
    def fire_old_timer(self, data: st.DataObject) -> None:
        timer = data.draw(st.sampled_from(self.seen_timers))
        if timer in self.machine.due_timers(self.now):
            return  # still current: firing it is the scan's business
        before = (self.machine.slot_views(), self._every_snapshot(), self.machine.heartbeat(0))
        step = self._handle(TimerFired(timer=timer, now_ms=self.now, stimulus_id=self._stimulus()))
        assert step == Step(), f"stale {timer} acted: {step}"
        after = (self.machine.slot_views(), self._every_snapshot(), self.machine.heartbeat(0))
        assert before == after

    @rule(task_id=TASK_IDS)
    def read_result(self, task_id: str) -> None:
        expected = self.model.reply_of(task_id)
        try:
            snapshot = self.machine.get_result(task_id)
        except NotFound as error:
            missing: NotFound | None = error
        else:
            missing = None
        if missing is not None:
            assert expected is None, f"{task_id} lost; model has {expected}"
            assert missing.evicted == (task_id in self.model.evicted), f"{task_id}: {missing}"
            return
        assert (snapshot.state, snapshot.phase) == expected

    def _every_snapshot(self) -> dict[str, TaskSnapshot | None]:
        snapshots: dict[str, TaskSnapshot | None] = {}
        for task_id in ALL_TASK_IDS:
            try:
                snapshots[task_id] = self.machine.get_result(task_id)
            except NotFound:
                snapshots[task_id] = None
        return snapshots

    # -------------------------------------------------------------- invariants

    @invariant()
    def machine_is_consistent(self) -> None:
        self.machine.check_invariants()

    @invariant()
    def capacity_never_exceeded(self) -> None:
        views = self.machine.slot_views()
        assert len(views) == self.config.task_slots
        held = [view.task_id for view in views if view.state is not SlotState.FREE]
        assert len(held) <= self.config.task_slots
        assert self.machine.free_capacity() == self.config.task_slots - len(held)

    @invariant()
    def one_slot_per_task_and_one_task_per_slot(self) -> None:
        views = self.machine.slot_views()
        counts = collections.Counter(view.task_id for view in views if view.task_id is not None)
        assert all(count == 1 for count in counts.values()), counts
        for view in views:
            assert (view.state is SlotState.FREE) == (view.task_id is None)
            if view.task_id is not None:
                snapshot = self.machine.get_result(view.task_id)
                assert snapshot.slot_id == view.slot_id
                assert not snapshot.is_terminal
        # Every live task holds a slot: the model's live set is the table's.
        assert set(counts) == set(self.model.live)

    @invariant()
    def heartbeat_equals_table(self) -> None:
        views = self.machine.slot_views()
        heartbeat = self.machine.heartbeat(self.now)
        allocated = sum(view.state is SlotState.ALLOCATED for view in views)
        running = sum(view.state is SlotState.RUNNING for view in views)
        assert heartbeat.at_ms == self.now
        assert heartbeat.slots_total == len(views)
        assert heartbeat.reserved_slots == allocated
        assert heartbeat.running_tasks == running
        assert heartbeat.free_slots == len(views) - allocated - running
        assert heartbeat.draining == self.model.draining
        assert heartbeat.active_tasks == sum(t.submitted for t in self.model.live.values())

    @invariant()
    def every_reservation_changes_the_heartbeat(self) -> None:
        """A reservation counts even if its task ended within the step: coordinators rely
        on a changed heartbeat to hear from a worker they placed on."""
        granted = self.machine.heartbeat(self.now).slots_granted
        new_live = set(self.model.live) - self.live_seen
        assert granted >= self.granted_seen + len(new_live)
        self.granted_seen, self.live_seen = granted, set(self.model.live)

    @invariant()
    def agrees_with_model(self) -> None:
        for task_id, snapshot in self._every_snapshot().items():
            expected = self.model.reply_of(task_id)
            got = None if snapshot is None else (snapshot.state, snapshot.phase)
            assert got == expected, f"{task_id}: machine {got}, model {expected}"

    @invariant()
    def retained_bytes_stay_under_the_bound(self) -> None:
        """After every step the retained results fit the byte bound, unless one result
        alone is larger, and their count and bytes are the model's."""
        count, size = self.machine.retained()
        assert size <= self.config.result_retention_bytes or count == 1, (count, size)
        assert (count, size) == self.model.retained()

    @invariant()
    def armed_timers_agree_with_model(self) -> None:
        owner = {view.slot_id: view.task_id for view in self.machine.slot_views()}
        names = {
            TimerKind.SLOT_LEASE: "lease",
            TimerKind.TASK_DEADLINE: "deadline",
            TimerKind.WATCH_GRACE: "grace",
            TimerKind.RESULT_RETENTION: "purge",
        }
        armed = {
            (
                names[timer.kind],
                owner[timer.key] if timer.kind is TimerKind.SLOT_LEASE else timer.key,
                timer.due_ms,
            )
            for timer in self.machine.due_timers(10**15)
        }
        expected = {(kind, task_id, due) for due, _, kind, task_id in self.model.timers()}
        assert armed == expected, f"machine {armed}, model {expected}"

    @invariant()
    def terminal_results_never_change_within_retention(self) -> None:
        for task_id, (result, until_ms) in self.results.items():
            if self.now < until_ms:
                snapshot = self.machine.get_result(task_id)
                assert snapshot.result == result, f"{task_id} result changed"

    @invariant()
    def stimuli_are_logged_under_their_own_ids(self) -> None:
        """The log holds the last events fed, in order, each under its event's non-empty id."""
        recent = self.machine.recent_stimuli
        for logged in recent:
            assert isinstance(logged.event, Event), f"{logged!r} logs a non-event"
            assert logged.stimulus_id, f"{logged!r} has no stimulus id"
            assert logged.stimulus_id == logged.event.stimulus_id, f"{logged!r} misnamed"
        assert [logged.event for logged in recent] == list(self.fed), "log lost or added events"
        assert all(logged.event is event for logged, event in zip(recent, self.fed, strict=True))

    @invariant()
    def live_tasks_ran_at_most_once(self) -> None:
        for task_id in self.model.live:
            if self.model.live[task_id].submitted:
                assert task_id in self.prepared


TestSlotTable = SlotTable.TestCase
