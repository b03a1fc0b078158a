"""Hypothesis state machine over the automatic worker's core (`WorkerCore`).

The test plays the hub: it offers attempts, answers (or never answers) the
core's control messages, drops and remakes the connection, lets time pass and
returns handlers, and keeps its own record from the commands alone. After every
step it checks the runtime's guarantees: a handler runs only under a granted
start and at most once per attempt; never more handlers than the capacity, and
no start beyond the slots available when something else shares them; at
most twice the capacity of attempts known; a message id always names the same
message; nothing but the session's opening and resume goes out before the
session is resumed; a lease that passed cancels its handler and nothing revives
it; the declared capacity stays within bounds; every command carries the
stimulus id of the event that caused it; and the core's own `check_invariants`.
"""

from __future__ import annotations

import itertools
import types

import hypothesis.strategies as st
from hypothesis import note
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from blockx.autoworker._core import (
    CancelHandler,
    CapacityChanged,
    Command,
    Connected,
    Disconnected,
    DrainRequested,
    Event,
    HandlerReturned,
    Link,
    Received,
    RunHandler,
    Send,
    SetLease,
    TimePassed,
    WorkerCore,
)
from blockx.hubwire import (
    AttemptStatus,
    ControlMessage,
    Disposition,
    Drain,
    DrainAck,
    Finish,
    Granted,
    Heartbeat,
    OpenSession,
    Outcome,
    Recorded,
    RefusalCode,
    Refused,
    Renew,
    Resume,
    Resumed,
    ResumedAttempt,
    SessionOpened,
    Start,
    Succeeded,
    Unknown,
)
from tests.core.autoworker_events import offer

OUTCOMES: list[Outcome] = [Succeeded(result="1"), Unknown(code="HANDLER_ERROR")]
REFUSALS = [RefusalCode.LEASE_LOST, RefusalCode.NOT_OFFERED, RefusalCode.UNKNOWN_ATTEMPT]


class WorkerCoreMachine(RuleBasedStateMachine):
    @initialize(capacity=st.integers(1, 3))
    def make(self, capacity: int) -> None:
        self.capacity = capacity
        self.available = capacity
        """The slots not taken by anything else, as last told."""
        self.core = WorkerCore(
            instance_id="i1", queue_id="q1", capabilities=(offer(0).capability,), capacity=capacity
        )
        self.now = 0
        self.numbers = itertools.count(1)
        self.stimuli = itertools.count(1)
        self.connected = False
        self.outstanding: dict[str, ControlMessage] = {}
        """Sent on this connection, not answered yet."""
        self.ids: dict[str, ControlMessage] = {}
        self.granted: set[str] = set()
        """Attempts whose start the hub granted (or resume found running)."""
        self.ran: set[str] = set()
        self.running: dict[str, int] = {}
        """Handlers running, and the lease deadline they were last given."""
        self.cancelled: set[str] = set()
        self.answers: list[Granted] = []
        self.resumed = True

    # ------------------------------------------------------------------ the step

    def _stimulus(self) -> str:
        return f"s{next(self.stimuli)}"

    def _step(self, event: Event) -> None:
        note(repr(event))
        for command in self.core.handle(event).commands:
            assert command.stimulus_id == event.stimulus_id, (
                f"{command!r} caused by {event.stimulus_id!r}"
            )
            self._record(command)

    def _record(self, command: Command) -> None:
        match command:
            case Send(messages=messages):
                for message in messages:
                    self._check_sent(message)
            case RunHandler(offer=offered, lease_deadline_ms=deadline_ms):
                attempt_id = offered.attempt_id
                assert attempt_id in self.granted, f"{attempt_id} ran without a grant"
                assert attempt_id not in self.ran, f"{attempt_id} ran twice"
                self.ran.add(attempt_id)
                self.running[attempt_id] = deadline_ms
                assert len(self.running) <= self.capacity, "more handlers than the capacity"
            case SetLease(attempt_id=attempt_id, lease_deadline_ms=deadline_ms):
                assert attempt_id not in self.cancelled, f"{attempt_id} revived after its lease"
                if attempt_id in self.running:
                    self.running[attempt_id] = deadline_ms
            case CancelHandler(attempt_id=attempt_id):
                self.cancelled.add(attempt_id)

    def _check_sent(self, message: object) -> None:
        assert self.connected, f"{message} sent with no connection"
        if isinstance(message, Heartbeat):
            assert 0 <= message.capacity <= self.available
            return
        assert isinstance(message, ControlMessage)
        if isinstance(message, Start) and message.message_id not in self.ids:
            assert self.core.held <= self.available, "started beyond the slots available"
        if isinstance(message, OpenSession):
            assert message.capacity <= self.available, "declared slots taken by others"
        earlier = self.ids.setdefault(message.message_id, message)
        assert earlier == message, f"id {message.message_id} reused: {earlier} then {message}"
        if not self.resumed:
            assert isinstance(message, OpenSession | Resume), f"{message} before the resume"
        if isinstance(message, OpenSession) and self.core.known:
            assert message.capacity == 0, "capacity offered before the resume"
        self.outstanding[message.message_id] = message

    def _answer(self, kind: type | types.UnionType) -> list[ControlMessage]:
        return [m for m in self.outstanding.values() if isinstance(m, kind)]

    # ------------------------------------------------------------------ connection

    @precondition(lambda self: not self.connected)
    @rule()
    def connect(self) -> None:
        self.connected = True
        self.resumed = False
        self._step(Connected(now_ms=self.now, stimulus_id=self._stimulus()))

    @precondition(lambda self: self.connected)
    @rule()
    def disconnect(self) -> None:
        self.connected = False
        self.outstanding.clear()
        self._step(Disconnected(now_ms=self.now, stimulus_id=self._stimulus()))

    @precondition(lambda self: any(isinstance(m, OpenSession) for m in self.outstanding.values()))
    @rule(ttl_ms=st.sampled_from([300, 15_000]))
    def open_session(self, ttl_ms: int) -> None:
        [opening] = self._answer(OpenSession)
        del self.outstanding[opening.message_id]
        if not self.core.known:
            self.resumed = True
        self._step(
            Received(
                now_ms=self.now,
                stimulus_id=self._stimulus(),
                message=SessionOpened(reply_to=opening.message_id, session_ttl_ms=ttl_ms),
            )
        )

    @precondition(lambda self: any(isinstance(m, Resume) for m in self.outstanding.values()))
    @rule(data=st.data())
    def resume(self, data: st.DataObject) -> None:
        [resume] = self._answer(Resume)
        assert isinstance(resume, Resume)
        del self.outstanding[resume.message_id]
        found = []
        for ref in resume.attempts:
            status = data.draw(st.sampled_from(AttemptStatus))
            if status is AttemptStatus.RUNNING:
                self.granted.add(ref.attempt_id)
            found.append(
                ResumedAttempt(
                    attempt_id=ref.attempt_id,
                    epoch=ref.epoch,
                    status=status,
                    lease_deadline_ms=self.now + data.draw(st.integers(1, 5_000)),
                )
            )
        self.resumed = True
        self._step(
            Received(
                now_ms=self.now,
                stimulus_id=self._stimulus(),
                message=Resumed(reply_to=resume.message_id, attempts=tuple(found)),
            )
        )

    # ------------------------------------------------------------------ work

    @precondition(lambda self: self.connected and self.resumed)
    @rule(offer_ms=st.integers(0, 3_000))
    def offer_attempt(self, offer_ms: int) -> None:
        self._step(
            Received(
                now_ms=self.now,
                stimulus_id=self._stimulus(),
                message=offer(next(self.numbers), deadline_ms=self.now + offer_ms),
            )
        )

    @precondition(lambda self: any(isinstance(m, Start | Renew) for m in self.outstanding.values()))
    @rule(data=st.data(), grant=st.booleans(), lease_ms=st.integers(-10, 5_000))
    def answer_start_or_renew(self, data: st.DataObject, grant: bool, lease_ms: int) -> None:
        request = data.draw(st.sampled_from(self._answer(Start | Renew)))
        assert isinstance(request, Start | Renew)
        del self.outstanding[request.message_id]
        if grant:
            if isinstance(request, Start):
                self.granted.add(request.attempt_id)
            answer = Granted(
                reply_to=request.message_id,
                attempt_id=request.attempt_id,
                lease_deadline_ms=self.now + lease_ms,
            )
            self.answers.append(answer)
            self._step(Received(now_ms=self.now, stimulus_id=self._stimulus(), message=answer))
        else:
            code = data.draw(st.sampled_from(REFUSALS))
            refused = Refused(
                reply_to=request.message_id, attempt_id=request.attempt_id, code=code, message=""
            )
            self._step(Received(now_ms=self.now, stimulus_id=self._stimulus(), message=refused))

    @precondition(lambda self: self.answers and self.connected)
    @rule(data=st.data())
    def an_answer_comes_again(self, data: st.DataObject) -> None:
        self._step(
            Received(
                now_ms=self.now,
                stimulus_id=self._stimulus(),
                message=data.draw(st.sampled_from(self.answers)),
            )
        )

    @precondition(lambda self: any(isinstance(m, Finish) for m in self.outstanding.values()))
    @rule(data=st.data(), disposition=st.sampled_from(Disposition))
    def answer_finish(self, data: st.DataObject, disposition: Disposition) -> None:
        finish = data.draw(st.sampled_from(self._answer(Finish)))
        assert isinstance(finish, Finish)
        del self.outstanding[finish.message_id]
        recorded = Recorded(
            reply_to=finish.message_id, attempt_id=finish.attempt_id, disposition=disposition
        )
        self._step(Received(now_ms=self.now, stimulus_id=self._stimulus(), message=recorded))

    @precondition(lambda self: any(isinstance(m, Drain) for m in self.outstanding.values()))
    @rule()
    def answer_drain(self) -> None:
        [drain] = self._answer(Drain)
        del self.outstanding[drain.message_id]
        self._step(
            Received(
                now_ms=self.now,
                stimulus_id=self._stimulus(),
                message=DrainAck(reply_to=drain.message_id, offered=()),
            )
        )

    @precondition(lambda self: self.running)
    @rule(data=st.data(), outcome=st.sampled_from(OUTCOMES))
    def a_handler_returns(self, data: st.DataObject, outcome: Outcome) -> None:
        attempt_id = data.draw(st.sampled_from(sorted(self.running)))
        del self.running[attempt_id]
        self._step(
            HandlerReturned(
                now_ms=self.now,
                stimulus_id=self._stimulus(),
                attempt_id=attempt_id,
                outcome=outcome,
            )
        )

    @rule(ms=st.integers(0, 3_000))
    def time_passes(self, ms: int) -> None:
        self.now += ms
        self._step(TimePassed(now_ms=self.now, stimulus_id=self._stimulus()))
        for attempt_id, deadline_ms in self.running.items():
            if deadline_ms <= self.now:
                assert attempt_id in self.cancelled, f"{attempt_id} outlived its lease"

    @rule(data=st.data())
    def slots_are_shared(self, data: st.DataObject) -> None:
        self.available = data.draw(st.integers(0, self.capacity), label="available")
        event = CapacityChanged(
            now_ms=self.now, stimulus_id=self._stimulus(), available=self.available
        )
        self._step(event)
        if self.core.link is Link.OPEN:
            assert self.core.declared_capacity() <= self.available

    @rule()
    def drain(self) -> None:
        self._step(DrainRequested(now_ms=self.now, stimulus_id=self._stimulus()))

    # ------------------------------------------------------------------ always

    @invariant()
    def core_is_consistent(self) -> None:
        if hasattr(self, "core"):
            self.core.check_invariants()

    @invariant()
    def bounded(self) -> None:
        if not hasattr(self, "core"):
            return
        assert self.core.known <= 2 * self.capacity
        assert 0 <= self.core.declared_capacity() <= self.capacity
        assert self.core.running == len(self.running)
        if not self.connected:
            assert self.core.link is Link.DOWN
        if self.core.drained():  # the run may end: nothing of it is left anywhere
            assert (self.core.known, self.core.running, len(self.running)) == (0, 0, 0)


TestWorkerCore = WorkerCoreMachine.TestCase
