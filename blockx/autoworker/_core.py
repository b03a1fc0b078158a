"""The automatic worker's rules, as a pure machine: events in, commands out.

`WorkerCore.handle(event)` takes what happened (a connection made or lost, a
message from the hub, a handler returned, time passed) with the time it
happened, and returns the commands that follow: messages to send, handlers to
start or cancel, leases to set, notices to emit. It does no IO and reads no
clock, so every rule below is tested by feeding it events.

Every event carries the id of the stimulus that caused it (required: the
runtime stamps it where it makes the event), every command the id of the
event it answers, and the core keeps its recent events in a bounded log
(`recent_stimuli`). `check_invariants()` checks the rules that hold between
any two events; every test of the core runs it.

Rules:

1. A handler runs only under a granted Start that is still valid, and an
   attempt's handler starts at most once. A lease that ran out (locally, by the
   hub's refusal, or as `Resume` finds it) cancels the handler; no later grant
   revives it.
2. Every control message (start, renew, finish, resume, drain) gets a message id
   once and keeps it: unanswered ones are sent again, with the same id, after a
   reconnect, so the hub's receipts make the repeat harmless.
3. After a reconnect the session opens with capacity 0 if any attempt is known,
   `Resume` asks about every known attempt, and only then is capacity offered.
4. Heartbeats go every third of the session TTL (at most `MAX_HEARTBEAT_MS`);
   a renew is due a third of the way through the remaining lease (at least
   `MIN_RENEW_MS` away); a lease the hub shortens is taken as it is.
5. Capacity: a handler slot is taken from Start until the handler returns (a
   handler that ignores its cancellation keeps it). The capacity declared to the
   hub leaves out slots the hub does not count: handlers still running after
   their lease was lost, and results not confirmed across a reconnect. Offers
   are kept up to `2 * capacity` known attempts; others are left to lapse.
   When the slots are shared (`CapacityChanged`: a worker node's own tasks take
   some), only the slots available count: starts stop while none is free at
   once, and the capacity declared follows `SHARED_DECLARE_MS` after the first
   change it has not told yet. A change undone by then is never declared: a
   node's own short tasks take and free a slot each, and each declaration costs
   the hub a heartbeat and a claim.
6. Drain: no new starts; what runs is renewed and its result confirmed. The
   machine is `drained()` once the hub acknowledged the drain and nothing is left.
"""

from __future__ import annotations

import collections
import enum
import itertools
from typing import Final, TypeAlias, assert_never

import attrs

from blockx.autoworker._handlers import INVALID_HANDLER_RESULT, lease_lost
from blockx.errors import Misuse
from blockx.hubwire import (
    AttemptRef,
    AttemptStatus,
    Capability,
    ControlMessage,
    Disposition,
    Drain,
    DrainAck,
    Finish,
    Granted,
    Heartbeat,
    HeartbeatAck,
    Offer,
    OpenSession,
    Outcome,
    Recorded,
    RefusalCode,
    Refused,
    Renew,
    Resume,
    Resumed,
    SessionOpened,
    Start,
    ToHub,
    Unknown,
)
from blockx.steps import LoggedStimulus, StimulusLog
from blockx.steps import Step as CoreStep

MAX_HEARTBEAT_MS: Final = 5_000
SETTLED_REMEMBERED: Final = 10_000
"""How many settled attempt ids are remembered, so a repeated offer never runs one twice."""
MIN_RENEW_MS: Final = 20
SHARED_DECLARE_MS: Final = 50
"""How long a change of the shared slots waits before it is declared (rule 5)."""


class Phase(enum.Enum):
    """Where an attempt is, as this worker sees it."""

    OFFERED = "OFFERED"
    """Offered, not started (no slot free yet, or draining)."""
    STARTING = "STARTING"
    """Start sent, no answer yet."""
    RUNNING = "RUNNING"
    """Granted: its handler runs."""
    LOST = "LOST"
    """Its lease ended; its handler was cancelled and has not returned yet."""
    FINISHING = "FINISHING"
    """The handler returned; Finish sent, not yet answered."""


_HOLDS_SLOT: Final = frozenset({Phase.STARTING, Phase.RUNNING, Phase.LOST})
"""The phases of an attempt that hold one of the worker's handler slots (rule 5)."""


class Link(enum.Enum):
    DOWN = "DOWN"
    OPENING = "OPENING"
    RESUMING = "RESUMING"
    OPEN = "OPEN"


# --- events ----------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class Connected:
    """A connection is up and its hello was welcomed."""

    now_ms: int
    stimulus_id: str


@attrs.frozen(kw_only=True)
class Disconnected:
    now_ms: int
    stimulus_id: str


FromHub: TypeAlias = (
    SessionOpened | HeartbeatAck | Offer | Granted | Refused | Recorded | Resumed | DrainAck
)
"""What the hub sends after its welcome, but `Error` (which ends the connection)."""


@attrs.frozen(kw_only=True)
class Received:
    now_ms: int
    stimulus_id: str
    message: FromHub


@attrs.frozen(kw_only=True)
class HandlerReturned:
    """The attempt's handler ended with `outcome` (LEASE_LOST if its lease ended first)."""

    now_ms: int
    stimulus_id: str
    attempt_id: str
    outcome: Outcome


@attrs.frozen(kw_only=True)
class TimePassed:
    now_ms: int
    stimulus_id: str


@attrs.frozen(kw_only=True)
class DrainRequested:
    now_ms: int
    stimulus_id: str


@attrs.frozen(kw_only=True)
class CapacityChanged:
    """The handler slots this worker may use from now on (at most its capacity): what is
    left when something else shares the slots (a worker node's own tasks)."""

    now_ms: int
    stimulus_id: str
    available: int


Event: TypeAlias = (
    Connected
    | Disconnected
    | Received
    | HandlerReturned
    | TimePassed
    | DrainRequested
    | CapacityChanged
)


# --- commands: each carries the id of the stimulus it answers -------------------------


@attrs.frozen(kw_only=True)
class Send:
    """Send these messages, in order, on the current connection."""

    messages: tuple[ToHub, ...]
    stimulus_id: str


@attrs.frozen(kw_only=True)
class RunHandler:
    offer: Offer
    lease_deadline_ms: int
    stimulus_id: str


@attrs.frozen(kw_only=True)
class SetLease:
    """The attempt's handler may run until `lease_deadline_ms`, no longer."""

    attempt_id: str
    lease_deadline_ms: int
    stimulus_id: str


@attrs.frozen(kw_only=True)
class CancelHandler:
    attempt_id: str
    stimulus_id: str


@attrs.frozen(kw_only=True)
class Notice:
    """A local notice for `Worker.events()`: a type, ids and a stable class only."""

    type: str
    task_id: str = ""
    attempt_id: str = ""
    detail: str = ""
    stimulus_id: str


Command: TypeAlias = Send | RunHandler | SetLease | CancelHandler | Notice

Step: TypeAlias = CoreStep[None, Command]
"""For annotations; steps are made with `CoreStep(...)`: calling the parameterized alias
is not allowed."""


@attrs.define
class _Commands:
    """The commands one event produces, each made with that event's stimulus id."""

    stimulus_id: str
    made: list[Command] = attrs.Factory(list)

    def send(self, *messages: ToHub) -> None:
        """Consecutive sends become one, so one step's messages share a frame."""
        last = self.made[-1] if self.made else None
        if isinstance(last, Send):
            self.made.pop()
            messages = last.messages + messages
        self.made.append(Send(messages=messages, stimulus_id=self.stimulus_id))

    def run_handler(self, offer: Offer, lease_deadline_ms: int) -> None:
        self.made.append(
            RunHandler(
                offer=offer, lease_deadline_ms=lease_deadline_ms, stimulus_id=self.stimulus_id
            )
        )

    def set_lease(self, attempt_id: str, lease_deadline_ms: int) -> None:
        self.made.append(
            SetLease(
                attempt_id=attempt_id,
                lease_deadline_ms=lease_deadline_ms,
                stimulus_id=self.stimulus_id,
            )
        )

    def cancel_handler(self, attempt_id: str) -> None:
        self.made.append(CancelHandler(attempt_id=attempt_id, stimulus_id=self.stimulus_id))

    def notice(self, type_: str, offer: Offer | None = None, detail: str = "") -> None:
        """A notice, about the attempt `offer` made if one is given."""
        self.made.append(
            Notice(
                type=type_,
                task_id="" if offer is None else offer.task_id,
                attempt_id="" if offer is None else offer.attempt_id,
                detail=detail,
                stimulus_id=self.stimulus_id,
            )
        )


@attrs.define(kw_only=True)
class _Attempt:
    offer: Offer
    phase: Phase = Phase.OFFERED
    lease_deadline_ms: int = 0
    renew_due_ms: int | None = None

    @property
    def attempt_id(self) -> str:
        return self.offer.attempt_id

    @property
    def holds_slot(self) -> bool:
        return self.phase in _HOLDS_SLOT


@attrs.define
class Counters:
    started: int = 0
    renewals_confirmed: int = 0
    reports_confirmed: int = 0
    evidence_confirmed: int = 0
    reconnects: int = 0


class WorkerCore:
    """The worker's state; see the module docstring. `handle` is the only mutator."""

    def __init__(
        self,
        *,
        instance_id: str,
        queue_id: str,
        capabilities: tuple[Capability, ...],
        capacity: int,
    ) -> None:
        self.instance_id = instance_id
        self._queue_id = queue_id
        self._capabilities = capabilities
        self.capacity = capacity
        self._available = capacity
        """Of `capacity`, the slots not taken by anything else (`CapacityChanged`)."""
        self.counters = Counters()
        self._attempts: dict[str, _Attempt] = {}
        self._in_phase: collections.Counter[Phase] = collections.Counter()
        """How many of `_attempts` are in each phase, kept at every change (`_know`,
        `_move`, `_forget`): the rules count them after every event, and a pass over
        every attempt each time cost a worker holding a hundred of them more than the
        rest of the event."""
        self._pending: dict[str, ControlMessage] = {}
        """Control messages sent (or to send) and not answered, by message id, in order."""
        self._ids = itertools.count(1)
        self._link = Link.DOWN
        self._links = 0
        self._opening_id = ""
        self._resume_id = ""
        self._heartbeat_every_ms = MAX_HEARTBEAT_MS
        self.session_ttl_ms: int | None = None
        """The session TTL the hub last gave: it answers within it, or the line is dead."""
        self._heartbeat_due_ms: int | None = None
        self._declared = -1
        self._declare_due_ms: int | None = None
        """When the shared slots changed, while the session is open: when the capacity
        to declare then is (rule 5)."""
        self._draining = False
        self._drain_id = ""
        self._drain_acked = False
        self._settled: collections.OrderedDict[str, None] = collections.OrderedDict()
        """Attempts this process ended (recorded or refused), newest last."""
        self._stale_results: set[str] = set()
        """Finishes sent on an earlier connection, still unanswered: the hub may not count
        their attempts any more, yet they are not settled."""
        self._log = StimulusLog()

    # ------------------------------------------------------------------ views

    @property
    def link(self) -> Link:
        return self._link

    @property
    def recent_stimuli(self) -> tuple[LoggedStimulus, ...]:
        """The last events handled, oldest first, with what came of each."""
        return self._log.recent

    @property
    def running(self) -> int:
        """Handlers started and not returned."""
        return self._in_phase[Phase.RUNNING] + self._in_phase[Phase.LOST]

    @property
    def held(self) -> int:
        """Handler slots taken (rule 5): from a start sent until the handler returns."""
        return sum(self._in_phase[phase] for phase in _HOLDS_SLOT)

    @property
    def unconfirmed(self) -> int:
        """Results sent and not yet answered."""
        return self._in_phase[Phase.FINISHING]

    @property
    def known(self) -> int:
        return len(self._attempts)

    def drained(self) -> bool:
        """Draining, holding no attempt, and the hub told (or no connection up: with
        nothing held, there is nothing left to tell it, and no hub may answer)."""
        return (
            self._draining and not self._attempts and (self._drain_acked or self._link is Link.DOWN)
        )

    def phase_of(self, attempt_id: str) -> Phase | None:
        attempt = self._attempts.get(attempt_id)
        return None if attempt is None else attempt.phase

    def lease_of(self, attempt_id: str) -> int | None:
        attempt = self._attempts.get(attempt_id)
        return None if attempt is None else attempt.lease_deadline_ms

    def declared_capacity(self) -> int:
        """What the hub is told it may hold of this worker (see rule 5)."""
        if self._draining:
            return 0
        zombies = self._in_phase[Phase.LOST]
        return max(0, self._available - zombies - len(self._stale_results))

    def next_deadline_ms(self) -> int | None:
        """When `TimePassed` should come next, if nothing else happens before."""
        dues: list[int] = []
        if self._heartbeat_due_ms is not None:
            dues.append(self._heartbeat_due_ms)
        if self._declare_due_ms is not None:
            dues.append(self._declare_due_ms)
        for attempt in self._attempts.values():
            if attempt.phase is Phase.OFFERED:
                dues.append(attempt.offer.offer_deadline_ms)
            elif attempt.phase is Phase.RUNNING:
                dues.append(attempt.lease_deadline_ms)
                if attempt.renew_due_ms is not None:
                    dues.append(attempt.renew_due_ms)
        return min(dues, default=None)

    # ------------------------------------------------------------------ the mutator

    def handle(self, event: Event) -> Step:
        """Apply one event. Raises `Misuse` (state unchanged) on an event it never allows."""
        return self._log.apply(event, self._dispatch)

    def _dispatch(self, event: Event) -> Step:
        commands = _Commands(stimulus_id=event.stimulus_id)
        match event:
            case Connected(now_ms=now_ms):
                self._on_connected(now_ms, commands)
            case Disconnected():
                self._on_disconnected(commands)
            case Received(now_ms=now_ms, message=message):
                self._on_message(now_ms, message, commands)
            case HandlerReturned(now_ms=now_ms, attempt_id=attempt_id, outcome=outcome):
                self._on_returned(now_ms, attempt_id, outcome, commands)
            case TimePassed(now_ms=now_ms):
                self._on_time(now_ms, commands)
            case DrainRequested(now_ms=now_ms):
                self._on_drain(now_ms, commands)
            case CapacityChanged(now_ms=now_ms, available=available):
                if not 0 <= available <= self.capacity:
                    raise Misuse(what=f"{available} slots available of {self.capacity}")
                self._available = available
                if self._link is Link.OPEN and self._declare_due_ms is None:
                    self._declare_due_ms = now_ms + SHARED_DECLARE_MS
            case _:
                assert_never(event)
        self._start_what_fits(event.now_ms, commands)
        self._declare(event.now_ms, commands)
        return CoreStep(commands=tuple(commands.made))

    # ------------------------------------------------------------------ connection

    def _next_id(self) -> str:
        return f"m{next(self._ids)}"

    # ------------------------------------------------------------------ attempts

    def _know(self, attempt: _Attempt) -> None:
        self._attempts[attempt.attempt_id] = attempt
        self._in_phase[attempt.phase] += 1

    def _move(self, attempt: _Attempt, phase: Phase) -> None:
        self._in_phase[attempt.phase] -= 1
        self._in_phase[phase] += 1
        attempt.phase = phase

    def _forget(self, attempt: _Attempt) -> None:
        del self._attempts[attempt.attempt_id]
        self._in_phase[attempt.phase] -= 1

    def _on_connected(self, now_ms: int, commands: _Commands) -> None:
        if self._link is not Link.DOWN:
            raise Misuse(what="Connected while a connection is up")
        self._links += 1
        if self._links > 1:
            self.counters.reconnects += 1
        self._link = Link.OPENING
        self._opening_id = self._next_id()
        capacity = 0 if self._attempts else self.declared_capacity()
        opening = OpenSession(
            message_id=self._opening_id,
            instance_id=self.instance_id,
            queue_id=self._queue_id,
            capabilities=self._capabilities,
            capacity=capacity,
        )
        self._declared = capacity
        commands.send(opening)

    def _on_disconnected(self, commands: _Commands) -> None:
        if self._link is Link.DOWN:
            return
        self._link = Link.DOWN
        self._heartbeat_due_ms = None
        self._declare_due_ms = None
        for message in self._pending.values():
            if isinstance(message, Finish):
                self._stale_results.add(message.attempt_id)
        commands.notice("disconnected")

    def _send(self, message: ControlMessage, commands: _Commands) -> None:
        """Record `message` as pending; send it now if the session is open."""
        self._pending[message.message_id] = message
        if self._link is Link.OPEN:
            commands.send(message)

    def _on_session_opened(self, now_ms: int, message: SessionOpened, commands: _Commands) -> None:
        if self._link is not Link.OPENING or message.reply_to != self._opening_id:
            return
        self._set_ttl(now_ms, message.session_ttl_ms)
        if self._attempts:
            self._link = Link.RESUMING
            self._resume_id = self._next_id()
            refs = tuple(
                AttemptRef(attempt_id=a.attempt_id, epoch=a.offer.epoch)
                for a in self._attempts.values()
            )
            commands.send(Resume(message_id=self._resume_id, attempts=refs))
        else:
            self._open(commands)

    def _open(self, commands: _Commands) -> None:
        """The session may carry control messages now: what waited goes out, in order."""
        self._link = Link.OPEN
        if self._draining and not self._drain_id:
            self._drain_id = self._next_id()
            self._pending[self._drain_id] = Drain(message_id=self._drain_id)
        if self._pending:
            commands.send(*self._pending.values())
        if self._links > 1:
            commands.notice("reconnected")

    def _set_ttl(self, now_ms: int, ttl_ms: int) -> None:
        self._take_ttl(ttl_ms)
        self._heartbeat_due_ms = now_ms + self._heartbeat_every_ms

    def _take_ttl(self, ttl_ms: int) -> None:
        """Heartbeats every third of the hub's session TTL, at most `MAX_HEARTBEAT_MS` apart."""
        self.session_ttl_ms = ttl_ms
        self._heartbeat_every_ms = max(1, min(ttl_ms // 3, MAX_HEARTBEAT_MS))

    def _declare(self, now_ms: int, commands: _Commands) -> None:
        """A heartbeat when the capacity to declare changed: at once, or once a change of
        the shared slots has waited `SHARED_DECLARE_MS` (rule 5)."""
        if self._link is not Link.OPEN:
            return
        capacity = self.declared_capacity()
        if capacity == self._declared:
            self._declare_due_ms = None  # undone in time: nothing to tell
        elif self._declare_due_ms is None or self._declare_due_ms <= now_ms:
            self._declared = capacity
            self._declare_due_ms = None
            commands.send(Heartbeat(capacity=capacity))

    # ------------------------------------------------------------------ messages

    def _on_message(self, now_ms: int, message: FromHub, commands: _Commands) -> None:
        match message:
            case SessionOpened():
                self._on_session_opened(now_ms, message, commands)
            case HeartbeatAck(session_ttl_ms=ttl_ms):
                if self._link is Link.OPEN:
                    self._take_ttl(ttl_ms)
            case Offer():
                self._on_offer(message, commands)
            case Resumed():
                self._on_resumed(now_ms, message, commands)
            case Granted():
                self._on_granted(now_ms, message, commands)
            case Refused():
                self._on_refused(message, commands)
            case Recorded():
                self._on_recorded(message, commands)
            case DrainAck(reply_to=reply_to):
                self._on_drain_ack(reply_to, commands)

    def _on_offer(self, offer: Offer, commands: _Commands) -> None:
        known = offer.attempt_id in self._attempts or offer.attempt_id in self._settled
        if known or self._draining:
            return
        if offer.capability not in self._capabilities:
            commands.notice("offer_ignored", offer, "capability")
            return
        if len(self._attempts) >= 2 * self.capacity:
            commands.notice("offer_ignored", offer, "full")
            return
        self._know(_Attempt(offer=offer))

    def _on_resumed(self, now_ms: int, message: Resumed, commands: _Commands) -> None:
        if self._link is not Link.RESUMING or message.reply_to != self._resume_id:
            return
        for found in message.attempts:
            attempt = self._attempts.get(found.attempt_id)
            if attempt is None or attempt.offer.epoch != found.epoch:
                continue
            match found.status:
                case AttemptStatus.RUNNING if attempt.phase is Phase.STARTING:
                    # Granted, the answer lost: run under the lease as the hub has it now.
                    for message_id, message_ in list(self._pending.items()):
                        if isinstance(message_, Start) and message_.attempt_id == found.attempt_id:
                            del self._pending[message_id]
                    self._grant(now_ms, attempt, found.lease_deadline_ms, commands)
                case AttemptStatus.RUNNING:
                    if attempt.phase is Phase.RUNNING:
                        self._adopt_lease(now_ms, attempt, found.lease_deadline_ms, commands)
                case AttemptStatus.LOST:
                    self._lose(attempt, commands)
                case AttemptStatus.OFFERED:
                    pass  # a start still pending is sent again; an offer waits for a slot
        self._open(commands)

    def _on_granted(self, now_ms: int, message: Granted, commands: _Commands) -> None:
        request = self._pending.pop(message.reply_to, None)
        attempt = self._attempts.get(message.attempt_id)
        if request is None or attempt is None:
            return
        if isinstance(request, Start) and attempt.phase is Phase.STARTING:
            self._grant(now_ms, attempt, message.lease_deadline_ms, commands)
        elif isinstance(request, Renew):
            self.counters.renewals_confirmed += 1
            if attempt.phase is Phase.RUNNING:  # a lost lease is never revived
                self._adopt_lease(now_ms, attempt, message.lease_deadline_ms, commands)

    def _grant(self, now_ms: int, attempt: _Attempt, deadline_ms: int, commands: _Commands) -> None:
        """A granted start: the handler runs, unless the lease is over already."""
        if deadline_ms <= now_ms:
            self._forget(attempt)  # never ran; the hub ends it as expired
            return
        self._move(attempt, Phase.RUNNING)
        attempt.lease_deadline_ms = deadline_ms
        attempt.renew_due_ms = _renew_due(now_ms, deadline_ms)
        self.counters.started += 1
        commands.run_handler(attempt.offer, deadline_ms)
        commands.notice("started", attempt.offer)

    def _adopt_lease(
        self, now_ms: int, attempt: _Attempt, deadline_ms: int, commands: _Commands
    ) -> None:
        """Take the hub's deadline as it is, shorter or longer (rule 4)."""
        if deadline_ms <= now_ms:
            self._lose(attempt, commands)
            return
        attempt.lease_deadline_ms = deadline_ms
        attempt.renew_due_ms = _renew_due(now_ms, deadline_ms)
        commands.set_lease(attempt.attempt_id, deadline_ms)

    def _on_refused(self, message: Refused, commands: _Commands) -> None:
        request = self._pending.pop(message.reply_to, None)
        attempt = self._attempts.get(message.attempt_id)
        if request is None or attempt is None:
            return
        match request:
            case Start():
                if attempt.phase is Phase.STARTING:
                    self._forget(attempt)  # never ran: nothing to report
                    commands.notice("start_refused", attempt.offer, message.code.value)
            case Renew():
                if message.code is not RefusalCode.NOT_STARTED:
                    self._lose(attempt, commands)
            case Finish():
                self._on_finish_refused(attempt, request, message, commands)

    def _on_finish_refused(
        self, attempt: _Attempt, finish: Finish, message: Refused, commands: _Commands
    ) -> None:
        self._stale_results.discard(attempt.attempt_id)
        if message.code in (RefusalCode.TOO_LARGE, RefusalCode.INVALID_REPORT) and not (
            isinstance(finish.outcome, Unknown) and finish.outcome.code == INVALID_HANDLER_RESULT
        ):
            # Checked before sending, so this is a hub with other limits: report that.
            self._finish(attempt, Unknown(code=INVALID_HANDLER_RESULT), commands)
            return
        self._settle(attempt)  # the attempt is over at the hub
        commands.notice("report_refused", attempt.offer, message.code.value)

    def _on_recorded(self, message: Recorded, commands: _Commands) -> None:
        request = self._pending.pop(message.reply_to, None)
        attempt = self._attempts.get(message.attempt_id)
        if not isinstance(request, Finish) or attempt is None:
            return
        self._settle(attempt)
        self.counters.reports_confirmed += 1
        if message.disposition is Disposition.EVIDENCE_ONLY:
            self.counters.evidence_confirmed += 1
        commands.notice("confirmed", attempt.offer, message.disposition.value)

    def _on_drain_ack(self, reply_to: str, commands: _Commands) -> None:
        if self._pending.pop(reply_to, None) is None:
            return
        self._drain_acked = True
        for attempt in list(self._attempts.values()):
            if attempt.phase is Phase.OFFERED:
                self._forget(attempt)  # left to lapse: never started
        commands.notice("drain_acknowledged")

    # ------------------------------------------------------------------ handlers

    def _on_returned(
        self, now_ms: int, attempt_id: str, outcome: Outcome, commands: _Commands
    ) -> None:
        attempt = self._attempts.get(attempt_id)
        if attempt is None or attempt.phase not in (Phase.RUNNING, Phase.LOST):
            raise Misuse(what=f"attempt {attempt_id!r} returned without running")
        if attempt.phase is Phase.RUNNING and attempt.lease_deadline_ms <= now_ms:
            # The lease monitor cancelled it before this machine's own timer came due.
            self._lose(attempt, commands)
        if attempt.phase is Phase.LOST and isinstance(outcome, Unknown):
            outcome = lease_lost()
        self._finish(attempt, outcome, commands)
        kind = type(outcome).__name__.upper()
        code = getattr(outcome, "code", "")
        commands.notice("returned", attempt.offer, f"{kind}/{code}" if code else kind)

    def _finish(self, attempt: _Attempt, outcome: Outcome, commands: _Commands) -> None:
        self._move(attempt, Phase.FINISHING)
        attempt.renew_due_ms = None
        for message_id, message in list(self._pending.items()):
            if isinstance(message, Renew | Finish) and message.attempt_id == attempt.attempt_id:
                del self._pending[message_id]  # the report supersedes them
        finish = Finish(
            message_id=self._next_id(),
            attempt_id=attempt.attempt_id,
            epoch=attempt.offer.epoch,
            outcome=outcome,
        )
        self._send(finish, commands)

    def _settle(self, attempt: _Attempt) -> None:
        """The attempt is over for good: forget it, but not that it ran."""
        self._forget(attempt)
        self._stale_results.discard(attempt.attempt_id)
        self._settled[attempt.attempt_id] = None
        if len(self._settled) > SETTLED_REMEMBERED:
            self._settled.popitem(last=False)

    def _lose(self, attempt: _Attempt, commands: _Commands) -> None:
        """The attempt's lease is gone: stop its handler, or forget it if none runs."""
        match attempt.phase:
            case Phase.RUNNING:
                self._move(attempt, Phase.LOST)
                attempt.renew_due_ms = None
                commands.cancel_handler(attempt.attempt_id)
                commands.notice("lease_lost", attempt.offer)
            case Phase.OFFERED | Phase.STARTING:
                self._forget(attempt)
            case Phase.LOST | Phase.FINISHING:
                pass

    def _start_what_fits(self, now_ms: int, commands: _Commands) -> None:
        """Start the oldest offers still open, as far as free slots go (this runs after every
        event: it looks for the offers only when one may start)."""
        if self._draining or self._link is not Link.OPEN:
            return
        room = self._available - self.held
        if room <= 0 or not self._in_phase[Phase.OFFERED]:
            return
        waiting = [
            attempt
            for attempt in self._attempts.values()
            if attempt.phase is Phase.OFFERED and attempt.offer.offer_deadline_ms > now_ms
        ]
        for attempt in waiting[:room]:
            self._move(attempt, Phase.STARTING)
            start = Start(
                message_id=self._next_id(),
                attempt_id=attempt.attempt_id,
                epoch=attempt.offer.epoch,
            )
            self._send(start, commands)

    # ------------------------------------------------------------------ time, drain

    def _on_time(self, now_ms: int, commands: _Commands) -> None:
        for attempt in list(self._attempts.values()):
            if attempt.phase is Phase.OFFERED and attempt.offer.offer_deadline_ms <= now_ms:
                self._forget(attempt)
            elif attempt.phase is Phase.RUNNING:
                if attempt.lease_deadline_ms <= now_ms:
                    self._lose(attempt, commands)
                elif attempt.renew_due_ms is not None and attempt.renew_due_ms <= now_ms:
                    attempt.renew_due_ms = None  # the next is set by the answer
                    if not any(
                        isinstance(m, Renew) and m.attempt_id == attempt.attempt_id
                        for m in self._pending.values()
                    ):
                        renew = Renew(
                            message_id=self._next_id(),
                            attempt_id=attempt.attempt_id,
                            epoch=attempt.offer.epoch,
                        )
                        self._send(renew, commands)
        if self._heartbeat_due_ms is not None and self._heartbeat_due_ms <= now_ms:
            self._heartbeat_due_ms = now_ms + self._heartbeat_every_ms
            if self._link is Link.OPEN:  # resuming takes one round trip: the next one is due
                self._declared = self.declared_capacity()
                self._declare_due_ms = None
                commands.send(Heartbeat(capacity=self._declared))

    def _on_drain(self, now_ms: int, commands: _Commands) -> None:
        if self._draining:
            return
        self._draining = True
        for attempt in list(self._attempts.values()):
            if attempt.phase is Phase.OFFERED:
                self._forget(attempt)
        if self._link is Link.OPEN:
            self._drain_id = self._next_id()
            self._send(Drain(message_id=self._drain_id), commands)
        commands.notice("draining")

    # ------------------------------------------------------------------ invariants

    def check_invariants(self) -> None:
        """Raise AssertionError naming the rule that is broken, if any.

        The rules hold between any two events, given a hub that answers each request as
        the protocol says (a reply of the request's kind, about the attempt it named): a
        reply is matched to its request by `reply_to` alone, and the rest is not checked.
        """
        self._check_attempts()
        self._check_pending()
        self._check_link()
        self._check_drain()

    def _check_attempts(self) -> None:
        for attempt_id, attempt in self._attempts.items():
            phase = attempt.phase.value
            assert attempt.attempt_id == attempt_id, f"{attempt_id} kept under another id"
            assert attempt.offer.capability in self._capabilities, (
                f"{attempt_id} kept for a capability this worker did not declare"
            )
            if attempt.phase in (Phase.OFFERED, Phase.STARTING):
                assert attempt.lease_deadline_ms == 0, f"{attempt_id} {phase} with a lease"
                assert attempt.renew_due_ms is None, f"{attempt_id} {phase} with a renew due"
            if attempt.phase in (Phase.LOST, Phase.FINISHING):
                assert attempt.renew_due_ms is None, f"{attempt_id} {phase} with a renew due"
        known = len(self._attempts)
        assert known <= 2 * self.capacity, f"{known} attempts known, capacity {self.capacity}"
        in_phase = collections.Counter(attempt.phase for attempt in self._attempts.values())
        assert self._in_phase == in_phase, f"counted {self._in_phase} by phase, hold {in_phase}"
        held = sum(1 for attempt in self._attempts.values() if attempt.holds_slot)
        assert held <= self.capacity, f"{held} slots held, capacity {self.capacity}"
        settled_known = sorted(self._attempts.keys() & self._settled.keys())
        assert not settled_known, f"settled attempts still known: {settled_known}"
        assert len(self._settled) <= SETTLED_REMEMBERED, "more settled ids remembered than kept"
        not_finishing = sorted(
            attempt_id
            for attempt_id in self._stale_results
            if self.phase_of(attempt_id) is not Phase.FINISHING
        )
        assert not not_finishing, f"stale results of attempts not FINISHING: {not_finishing}"
        declared = self.declared_capacity()
        assert 0 <= declared <= self.capacity, f"declared capacity {declared} out of range"

    def _check_pending(self) -> None:
        """Every request waits for one answer under its own id: a start for each STARTING
        attempt, a report for each FINISHING one, at most one renewal per attempt."""
        waiting: collections.Counter[tuple[type, str]] = collections.Counter()
        for message_id, message in self._pending.items():
            assert message.message_id == message_id, f"{message!r} pending under {message_id}"
            assert isinstance(message, Start | Renew | Finish | Drain), (
                f"{message!r} pending: only starts, renewals, reports and the drain are"
            )
            if isinstance(message, Drain):
                assert message_id == self._drain_id, (
                    f"{message!r}, but the drain is {self._drain_id}"
                )
                continue
            waiting[type(message), message.attempt_id] += 1
            attempt = self._attempts.get(message.attempt_id)
            phase = None if attempt is None else attempt.phase
            assert phase in _WAITING_IN[type(message)], (
                f"{message!r} pending for an attempt {phase.value if phase else 'forgotten'}"
            )
            assert attempt is None or attempt.offer.epoch == message.epoch, (
                f"{message!r} under another epoch than its attempt's"
            )
        repeated = sorted(f"{kind.__name__} {key}" for (kind, key), n in waiting.items() if n > 1)
        assert not repeated, f"more than one request pending: {repeated}"
        for attempt_id, attempt in self._attempts.items():
            if attempt.phase is Phase.STARTING:
                assert waiting[Start, attempt_id], f"{attempt_id} STARTING without a Start"
            if attempt.phase is Phase.FINISHING:
                assert waiting[Finish, attempt_id], f"{attempt_id} FINISHING without a Finish"
        for message_id in (self._opening_id, self._resume_id):
            assert message_id not in self._pending, f"{message_id} used twice"

    def _check_link(self) -> None:
        link = self._link.value
        assert self._link is Link.DOWN or (self._links and self._opening_id), (
            f"{link} without a connection made"
        )
        session = self._link in (Link.RESUMING, Link.OPEN)
        assert session == (self._heartbeat_due_ms is not None), (
            f"{link} with heartbeat due {self._heartbeat_due_ms}"
        )
        assert not session or self.session_ttl_ms is not None, f"{link} before a session opened"
        assert self._link is not Link.RESUMING or self._resume_id, "RESUMING without a Resume"
        ttl_ms = self.session_ttl_ms
        every_ms = (
            MAX_HEARTBEAT_MS if ttl_ms is None else max(1, min(ttl_ms // 3, MAX_HEARTBEAT_MS))
        )
        assert self._heartbeat_every_ms == every_ms, (
            f"heartbeats every {self._heartbeat_every_ms} ms, session TTL {ttl_ms} ms"
        )
        assert self._link is Link.OPEN or self._declare_due_ms is None, (
            f"{link} with a declaration due at {self._declare_due_ms}"
        )
        assert (
            self._link is not Link.OPEN
            or self._declared == self.declared_capacity()
            or self._declare_due_ms is not None
        ), f"the hub holds capacity {self._declared}, not {self.declared_capacity()}"
        assert self.counters.reconnects == max(0, self._links - 1), "reconnects miscounted"

    def _check_drain(self) -> None:
        assert self._draining or not self._drain_id, "a drain asked for while not draining"
        assert not self._drain_acked or (self._drain_id and self._drain_id not in self._pending), (
            "a drain acknowledged that was not asked for"
        )
        if self._draining:
            offered = sorted(a for a, at in self._attempts.items() if at.phase is Phase.OFFERED)
            assert not offered, f"offers kept while draining: {offered}"
            assert self._link is not Link.OPEN or self._drain_id, "draining unknown to the hub"


_WAITING_IN: Final[dict[type, tuple[Phase | None, ...]]] = {
    Start: (Phase.STARTING, None),
    Renew: (Phase.RUNNING, Phase.LOST),
    Finish: (Phase.FINISHING,),
}
"""The phases an attempt may be in while a request about it waits for its answer (None: no
longer known). A Start outlives its attempt when `Resume` finds the attempt lost; a Renew
outlives the lease it asked to extend."""


def _renew_due(now_ms: int, deadline_ms: int) -> int:
    return now_ms + max(MIN_RENEW_MS, (deadline_ms - now_ms) // 3)
