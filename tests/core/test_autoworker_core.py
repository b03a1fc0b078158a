"""The automatic worker's rules, event by event (`blockx.autoworker._core`)."""

from __future__ import annotations

from typing import Any, get_args

import pytest

from blockx.autoworker._core import (
    MAX_HEARTBEAT_MS,
    MIN_RENEW_MS,
    SHARED_DECLARE_MS,
    CancelHandler,
    CapacityChanged,
    Command,
    Connected,
    Disconnected,
    DrainRequested,
    Event,
    HandlerReturned,
    Link,
    Notice,
    Phase,
    Received,
    RunHandler,
    Send,
    SetLease,
    TimePassed,
    WorkerCore,
)
from blockx.errors import Misuse
from blockx.hubwire import (
    AttemptRef,
    AttemptStatus,
    Disposition,
    Drain,
    DrainAck,
    Finish,
    Granted,
    Heartbeat,
    OpenSession,
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
from blockx.steps import RECENT_STIMULI, LoggedStimulus
from tests.core.autoworker_events import (
    CAP,
    OTHER,
    WorkerCoreFactory,
    connected,
    disconnected,
    drain_requested,
    of_type,
    offer,
    received,
    returned,
    sent,
    time_passed,
)

TTL_MS = 15_000


def opened(machine: WorkerCore, now_ms: int = 0) -> None:
    """Connect and open the session (no attempt known)."""
    [opening] = sent(machine.handle(connected(now_ms=now_ms)))
    assert isinstance(opening, OpenSession)
    reply = SessionOpened(reply_to=opening.message_id, session_ttl_ms=TTL_MS)
    machine.handle(received(reply, now_ms=now_ms))
    assert machine.link is Link.OPEN


def started(machine: WorkerCore, n: int, *, now_ms: int = 0, lease_ms: int = 3_000) -> Start:
    """Offer attempt `n` and grant its start; returns the start."""
    [start] = sent(machine.handle(received(offer(n), now_ms=now_ms)))
    assert isinstance(start, Start)
    granted = Granted(
        reply_to=start.message_id, attempt_id=start.attempt_id, lease_deadline_ms=now_ms + lease_ms
    )
    commands = machine.handle(received(granted, now_ms=now_ms))
    assert of_type(commands, RunHandler)
    return start


def test_a_session_opens_with_the_capacity_and_offers_start_up_to_it(
    make_worker_core: WorkerCoreFactory,
) -> None:
    machine = make_worker_core(capacity=2)
    [opening] = sent(machine.handle(connected(now_ms=0)))
    assert isinstance(opening, OpenSession)
    assert (opening.capacity, opening.capabilities, opening.queue_id) == (2, (CAP,), "q1")
    assert machine.link is Link.OPENING
    machine.handle(
        received(SessionOpened(reply_to=opening.message_id, session_ttl_ms=TTL_MS), now_ms=2)
    )
    starts = [sent(machine.handle(received(offer(n), now_ms=3))) for n in (1, 2, 3)]
    assert [[type(m) for m in s] for s in starts] == [[Start], [Start], []]  # no third slot
    assert machine.phase_of("a3") is Phase.OFFERED


def test_shared_slots_bound_the_starts_at_once_and_the_capacity_declared_soon_after(
    make_worker_core: WorkerCoreFactory,
) -> None:
    machine = make_worker_core(capacity=3)
    opened(machine)
    started(machine, 1)
    assert sent(machine.handle(CapacityChanged(now_ms=1, stimulus_id="taken", available=1))) == []
    assert sent(machine.handle(received(offer(2), now_ms=2))) == []  # no slot left to start in
    assert machine.phase_of("a2") is Phase.OFFERED
    assert machine.next_deadline_ms() == 1 + SHARED_DECLARE_MS
    due = machine.handle(time_passed(now_ms=1 + SHARED_DECLARE_MS))
    assert sent(due) == [Heartbeat(capacity=1)]  # the one running still counts
    freed = machine.handle(CapacityChanged(now_ms=100, stimulus_id="freed", available=3))
    assert [type(m) for m in sent(freed)] == [Start]
    assert machine.held == 2
    assert sent(machine.handle(time_passed(now_ms=100 + SHARED_DECLARE_MS))) == [
        Heartbeat(capacity=3)
    ]
    with pytest.raises(Misuse, match="4 slots available of 3"):
        machine.handle(CapacityChanged(now_ms=200, stimulus_id="wrong", available=4))


def test_a_change_of_the_shared_slots_undone_in_time_is_never_declared(
    make_worker_core: WorkerCoreFactory,
) -> None:
    machine = make_worker_core(capacity=3)
    opened(machine)
    for n, available in enumerate((2, 1, 3)):  # a node's own tasks take two slots, then end
        event = CapacityChanged(now_ms=10 * n, stimulus_id=f"slots-{n}", available=available)
        assert sent(machine.handle(event)) == []
    assert machine.next_deadline_ms() == MAX_HEARTBEAT_MS  # nothing left to declare
    assert sent(machine.handle(time_passed(now_ms=SHARED_DECLARE_MS))) == []
    machine.handle(CapacityChanged(now_ms=60, stimulus_id="taken", available=2))
    dropped = machine.handle(disconnected(now_ms=70))
    assert not of_type(dropped, Send)
    assert machine.next_deadline_ms() is None  # the next session opens with what is left
    [opening] = sent(machine.handle(connected(now_ms=80)))
    assert isinstance(opening, OpenSession)
    assert opening.capacity == 2


def test_a_handler_runs_only_once_its_start_is_granted_and_only_once(
    make_worker_core: WorkerCoreFactory,
) -> None:
    machine = make_worker_core()
    opened(machine)
    [start] = sent(machine.handle(received(offer(1), now_ms=0)))
    assert isinstance(start, Start)
    assert machine.running == 0
    granted = Granted(reply_to=start.message_id, attempt_id="a1", lease_deadline_ms=3_000)
    commands = machine.handle(received(granted, now_ms=10, stimulus_id="granted-a1"))
    assert of_type(commands, RunHandler) == [
        RunHandler(offer=offer(1), lease_deadline_ms=3_000, stimulus_id="granted-a1")
    ]
    again = machine.handle(received(granted, now_ms=11))  # a duplicate answer
    assert of_type(again, RunHandler) == []
    assert machine.handle(received(offer(1), now_ms=12)).commands == ()  # a repeated offer
    assert machine.counters.started == 1


def test_a_refused_start_forgets_the_attempt_and_frees_its_slot(
    make_worker_core: WorkerCoreFactory,
) -> None:
    machine = make_worker_core(capacity=1)
    opened(machine)
    [start] = sent(machine.handle(received(offer(1), now_ms=0)))
    machine.handle(received(offer(2), now_ms=0))
    refused = Refused(
        reply_to=start.message_id, attempt_id="a1", code=RefusalCode.NOT_OFFERED, message="gone"
    )
    commands = machine.handle(received(refused, now_ms=5))
    assert machine.phase_of("a1") is None
    assert [type(m) for m in sent(commands)] == [Start]  # the waiting offer takes the slot
    assert machine.phase_of("a2") is Phase.STARTING


def test_offers_beyond_twice_the_capacity_and_of_other_capabilities_are_not_kept(
    make_worker_core: WorkerCoreFactory,
) -> None:
    machine = make_worker_core(capacity=2)
    opened(machine)
    for n in range(1, 7):
        machine.handle(received(offer(n), now_ms=0))
    assert machine.known == 4
    commands = machine.handle(received(offer(9, capability=OTHER), now_ms=0))
    assert machine.phase_of("a9") is None
    assert [n.detail for n in of_type(commands, Notice)] == ["capability"]


def test_an_offer_not_started_by_its_deadline_is_dropped(
    make_worker_core: WorkerCoreFactory,
) -> None:
    machine = make_worker_core(capacity=1)
    opened(machine)
    started(machine, 1)
    machine.handle(received(offer(2, deadline_ms=500), now_ms=0))
    assert machine.next_deadline_ms() == 500
    machine.handle(time_passed(now_ms=500))
    assert machine.phase_of("a2") is None


def test_heartbeats_go_every_third_of_the_session_ttl_at_most_five_seconds(
    make_worker_core: WorkerCoreFactory,
) -> None:
    machine = make_worker_core()
    [opening] = sent(machine.handle(connected(now_ms=0)))
    machine.handle(
        received(SessionOpened(reply_to=opening.message_id, session_ttl_ms=3_000), now_ms=0)
    )
    assert machine.next_deadline_ms() == 1_000
    assert sent(machine.handle(time_passed(now_ms=1_000))) == [Heartbeat(capacity=2)]
    assert machine.next_deadline_ms() == 2_000
    long = make_worker_core()
    [opening] = sent(long.handle(connected(now_ms=0)))
    long.handle(
        received(SessionOpened(reply_to=opening.message_id, session_ttl_ms=60_000), now_ms=0)
    )
    assert long.next_deadline_ms() == MAX_HEARTBEAT_MS


@pytest.mark.parametrize(("lease_ms", "due_ms"), [(3_000, 1_000), (30, MIN_RENEW_MS)])
def test_a_renew_is_due_a_third_into_the_remaining_lease_never_under_20_ms(
    lease_ms: int, due_ms: int, make_worker_core: WorkerCoreFactory
) -> None:
    machine = make_worker_core()
    opened(machine)
    started(machine, 1, lease_ms=lease_ms)
    assert machine.next_deadline_ms() == due_ms
    [renew] = sent(machine.handle(time_passed(now_ms=due_ms)))
    assert isinstance(renew, Renew)
    assert (renew.attempt_id, renew.epoch) == ("a1", 1)


def test_a_renewed_lease_is_taken_as_the_hub_gives_it_even_shorter(
    make_worker_core: WorkerCoreFactory,
) -> None:
    machine = make_worker_core()
    opened(machine)
    started(machine, 1, lease_ms=3_000)
    [renew] = sent(machine.handle(time_passed(now_ms=1_000)))
    shorter = Granted(reply_to=renew.message_id, attempt_id="a1", lease_deadline_ms=2_000)
    commands = machine.handle(received(shorter, now_ms=1_010, stimulus_id="renewed"))
    assert of_type(commands, SetLease) == [
        SetLease(attempt_id="a1", lease_deadline_ms=2_000, stimulus_id="renewed")
    ]
    assert machine.lease_of("a1") == 2_000
    assert machine.counters.renewals_confirmed == 1


def test_a_lease_that_ran_out_cancels_the_handler_and_a_late_grant_does_not_revive_it(
    make_worker_core: WorkerCoreFactory,
) -> None:
    machine = make_worker_core()
    opened(machine)
    started(machine, 1, lease_ms=3_000)
    [renew] = sent(machine.handle(time_passed(now_ms=1_000)))
    commands = machine.handle(time_passed(now_ms=3_000, stimulus_id="tick-3000"))
    # The renew was never answered.
    assert of_type(commands, CancelHandler) == [
        CancelHandler(attempt_id="a1", stimulus_id="tick-3000")
    ]
    assert machine.phase_of("a1") is Phase.LOST
    late = Granted(reply_to=renew.message_id, attempt_id="a1", lease_deadline_ms=6_000)
    assert of_type(machine.handle(received(late, now_ms=3_001)), SetLease) == []
    assert machine.phase_of("a1") is Phase.LOST
    # The cancelled handler's report is LEASE_LOST, whatever it raised.
    after = machine.handle(returned("a1", Unknown(code="HANDLER_ERROR"), now_ms=3_002))
    [finish] = [m for m in sent(after) if isinstance(m, Finish)]
    assert finish.outcome == Unknown(code="LEASE_LOST")


def test_a_lost_handler_still_running_lowers_the_declared_capacity(
    make_worker_core: WorkerCoreFactory,
) -> None:
    machine = make_worker_core(capacity=2)
    opened(machine)
    started(machine, 1, lease_ms=3_000)
    machine.handle(time_passed(now_ms=1_000))  # the renew goes out, never answered
    commands = machine.handle(time_passed(now_ms=3_000))
    assert of_type(commands, CancelHandler) == [CancelHandler(attempt_id="a1", stimulus_id="tick")]
    assert sent(commands) == [Heartbeat(capacity=1)]  # the cancelled handler holds its slot
    after = machine.handle(returned("a1", Succeeded(result="1"), now_ms=3_500))
    [finish, heartbeat] = sent(after)
    assert isinstance(finish, Finish)
    assert finish.outcome == Succeeded(result="1")  # sent as it is: the hub keeps evidence
    assert heartbeat == Heartbeat(capacity=2)


def test_a_reconnect_resumes_before_offering_capacity_and_resends_with_the_same_ids(
    make_worker_core: WorkerCoreFactory,
) -> None:
    machine = make_worker_core(capacity=2)
    opened(machine)
    started(machine, 1)
    [start2] = sent(machine.handle(received(offer(2), now_ms=0)))
    finish = sent(machine.handle(returned("a1", Succeeded(result="1"), now_ms=50)))
    machine.handle(disconnected(now_ms=60))
    assert machine.declared_capacity() == 1  # a result unconfirmed across the loss

    [opening] = sent(machine.handle(connected(now_ms=100)))
    assert isinstance(opening, OpenSession)
    assert opening.capacity == 0  # attempts are known: resume first
    [resume] = sent(
        machine.handle(
            received(SessionOpened(reply_to=opening.message_id, session_ttl_ms=TTL_MS), now_ms=110)
        )
    )
    assert isinstance(resume, Resume)
    assert set(resume.attempts) == {
        AttemptRef(attempt_id="a1", epoch=1),
        AttemptRef(attempt_id="a2", epoch=1),
    }
    statuses = (
        ResumedAttempt(
            attempt_id="a1", epoch=1, status=AttemptStatus.RUNNING, lease_deadline_ms=3_000
        ),
        ResumedAttempt(
            attempt_id="a2", epoch=1, status=AttemptStatus.OFFERED, lease_deadline_ms=5_000
        ),
    )
    commands = machine.handle(
        received(Resumed(reply_to=resume.message_id, attempts=statuses), now_ms=120)
    )
    resent = sent(commands)
    assert resent[:2] == [start2, *finish]  # the original messages, ids and all
    assert resent[2:] == [Heartbeat(capacity=1)]
    assert machine.counters.reconnects == 1


def test_a_start_granted_while_the_answer_was_lost_runs_under_the_resumed_lease(
    make_worker_core: WorkerCoreFactory,
) -> None:
    machine = make_worker_core()
    opened(machine)
    [start] = sent(machine.handle(received(offer(1), now_ms=0)))
    machine.handle(disconnected(now_ms=10))
    [opening] = sent(machine.handle(connected(now_ms=20)))
    [resume] = sent(
        machine.handle(
            received(SessionOpened(reply_to=opening.message_id, session_ttl_ms=TTL_MS), now_ms=20)
        )
    )
    running = ResumedAttempt(
        attempt_id="a1", epoch=1, status=AttemptStatus.RUNNING, lease_deadline_ms=4_000
    )
    commands = machine.handle(
        received(
            Resumed(reply_to=resume.message_id, attempts=(running,)),
            now_ms=30,
            stimulus_id="resumed",
        )
    )
    assert of_type(commands, RunHandler) == [
        RunHandler(offer=offer(1), lease_deadline_ms=4_000, stimulus_id="resumed")
    ]
    assert start not in sent(commands)  # no need to ask again


def test_resume_finding_an_attempt_lost_cancels_its_handler(
    make_worker_core: WorkerCoreFactory,
) -> None:
    machine = make_worker_core()
    opened(machine)
    started(machine, 1)
    machine.handle(disconnected(now_ms=10))
    [opening] = sent(machine.handle(connected(now_ms=20)))
    [resume] = sent(
        machine.handle(
            received(SessionOpened(reply_to=opening.message_id, session_ttl_ms=TTL_MS), now_ms=20)
        )
    )
    lost = ResumedAttempt(attempt_id="a1", epoch=1, status=AttemptStatus.LOST)
    commands = machine.handle(
        received(Resumed(reply_to=resume.message_id, attempts=(lost,)), now_ms=30)
    )
    assert of_type(commands, CancelHandler) == [
        CancelHandler(attempt_id="a1", stimulus_id="received")
    ]


def test_a_start_outlives_an_attempt_resume_found_lost_until_the_hub_answers_it(
    make_worker_core: WorkerCoreFactory,
) -> None:
    machine = make_worker_core()
    opened(machine)
    [start] = sent(machine.handle(received(offer(1), now_ms=0)))
    machine.handle(disconnected(now_ms=10))
    [opening] = sent(machine.handle(connected(now_ms=20)))
    [resume] = sent(
        machine.handle(
            received(SessionOpened(reply_to=opening.message_id, session_ttl_ms=TTL_MS), now_ms=20)
        )
    )
    lost = ResumedAttempt(attempt_id="a1", epoch=1, status=AttemptStatus.LOST)
    step = machine.handle(
        received(Resumed(reply_to=resume.message_id, attempts=(lost,)), now_ms=30)
    )
    assert machine.phase_of("a1") is None
    assert start in sent(step)  # still unanswered: sent again, under its id
    machine.check_invariants()  # a pending Start may name an attempt no longer known
    refused = Refused(
        reply_to=start.message_id, attempt_id="a1", code=RefusalCode.NOT_OFFERED, message=""
    )
    assert machine.handle(received(refused, now_ms=40)).commands == ()


def test_recorded_settles_the_attempt_and_counts_evidence(
    make_worker_core: WorkerCoreFactory,
) -> None:
    machine = make_worker_core()
    opened(machine)
    started(machine, 1)
    [finish] = sent(machine.handle(returned("a1", Succeeded(result="1"), now_ms=5)))
    assert isinstance(finish, Finish)
    recorded = Recorded(
        reply_to=finish.message_id, attempt_id="a1", disposition=Disposition.EVIDENCE_ONLY
    )
    machine.handle(received(recorded, now_ms=6))
    assert machine.phase_of("a1") is None
    assert (machine.counters.reports_confirmed, machine.counters.evidence_confirmed) == (1, 1)


def test_a_drain_without_a_connection_or_attempts_is_done_at_once(
    make_worker_core: WorkerCoreFactory,
) -> None:
    """No hub can acknowledge it, and nothing is held that the hub must be told of."""
    never_connected = make_worker_core(capacity=1)
    assert sent(never_connected.handle(drain_requested(now_ms=0))) == []
    assert never_connected.drained()
    lost = make_worker_core(capacity=1)
    opened(lost)
    started(lost, 1)
    lost.handle(disconnected(now_ms=5))
    lost.handle(drain_requested(now_ms=10))
    assert not lost.drained()  # a1 still runs: its result is to be confirmed on reconnecting
    lost.handle(returned("a1", Succeeded(result="1"), now_ms=20))
    assert not lost.drained()


def test_a_drain_stops_starts_finishes_what_runs_and_ends_drained(
    make_worker_core: WorkerCoreFactory,
) -> None:
    machine = make_worker_core(capacity=1)
    opened(machine)
    started(machine, 1)
    machine.handle(received(offer(2), now_ms=0))
    drain, *_ = sent(machine.handle(drain_requested(now_ms=10)))
    assert isinstance(drain, Drain)
    assert machine.phase_of("a2") is None  # never started: left to lapse
    assert sent(machine.handle(received(offer(3), now_ms=11))) == []
    machine.handle(received(DrainAck(reply_to=drain.message_id, offered=("a2",)), now_ms=12))
    assert not machine.drained()  # a1 still runs
    [finish] = sent(machine.handle(returned("a1", Succeeded(result="1"), now_ms=20)))
    assert isinstance(finish, Finish)
    machine.handle(
        received(
            Recorded(reply_to=finish.message_id, attempt_id="a1", disposition=Disposition.ACCEPTED),
            now_ms=21,
        )
    )
    assert machine.drained()


def test_misuse_is_refused(make_worker_core: WorkerCoreFactory) -> None:
    machine = make_worker_core()
    opened(machine)
    with pytest.raises(Misuse):
        machine.handle(connected(now_ms=1))
    with pytest.raises(Misuse):
        machine.handle(returned("nope", Succeeded(result="1"), now_ms=1))


def test_an_attempt_settled_here_is_never_run_again_if_offered_again(
    make_worker_core: WorkerCoreFactory,
) -> None:
    machine = make_worker_core()
    opened(machine)
    started(machine, 1)
    [finish] = sent(machine.handle(returned("a1", Succeeded(result="1"), now_ms=5)))
    recorded = Recorded(
        reply_to=finish.message_id, attempt_id="a1", disposition=Disposition.ACCEPTED
    )
    machine.handle(received(recorded, now_ms=6))
    assert machine.handle(received(offer(1), now_ms=7)).commands == ()
    assert machine.phase_of("a1") is None


def test_recent_stimuli_name_each_event_and_what_came_of_it(
    make_worker_core: WorkerCoreFactory,
) -> None:
    machine = make_worker_core(capacity=1)
    events: list[Event] = [connected(now_ms=0, stimulus_id="s1")]
    [opening] = sent(machine.handle(events[-1]))
    events.append(
        received(
            SessionOpened(reply_to=opening.message_id, session_ttl_ms=TTL_MS),
            now_ms=1,
            stimulus_id="s2",
        )
    )
    machine.handle(events[-1])
    events.append(received(offer(1), now_ms=2, stimulus_id="s3"))
    [start] = sent(machine.handle(events[-1]))
    granted = Granted(reply_to=start.message_id, attempt_id="a1", lease_deadline_ms=3_000)
    events.append(received(granted, now_ms=3, stimulus_id="s4"))
    step = machine.handle(events[-1])
    assert {command.stimulus_id for command in step.commands} == {"s4"}
    refused = connected(now_ms=4, stimulus_id="s5")
    with pytest.raises(Misuse):
        machine.handle(refused)
    events.append(returned("a1", Succeeded(result="1"), now_ms=5, stimulus_id="s6"))
    machine.handle(events[-1])

    assert machine.recent_stimuli == (
        LoggedStimulus(stimulus_id="s1", event=events[0], outcome="Send"),
        LoggedStimulus(stimulus_id="s2", event=events[1], outcome="-"),
        LoggedStimulus(stimulus_id="s3", event=events[2], outcome="Send"),
        LoggedStimulus(stimulus_id="s4", event=events[3], outcome="RunHandler,Notice"),
        LoggedStimulus(stimulus_id="s5", event=refused, outcome="Misuse"),
        LoggedStimulus(stimulus_id="s6", event=events[4], outcome="Send,Notice"),
    )


def test_recent_stimuli_keep_only_the_latest(make_worker_core: WorkerCoreFactory) -> None:
    machine = make_worker_core()
    for now_ms in range(RECENT_STIMULI + 10):
        machine.handle(time_passed(now_ms=now_ms, stimulus_id=f"tick-{now_ms}"))
    recent = machine.recent_stimuli
    assert len(recent) == RECENT_STIMULI
    assert (recent[0].stimulus_id, recent[-1].stimulus_id) == (
        "tick-10",
        f"tick-{RECENT_STIMULI + 9}",
    )


WITHOUT_STIMULUS_ID: dict[type[Event] | type[Command], dict[str, Any]] = {
    Connected: {"now_ms": 0},
    Disconnected: {"now_ms": 0},
    Received: {"now_ms": 0, "message": offer(1)},
    HandlerReturned: {"now_ms": 0, "attempt_id": "a1", "outcome": Succeeded(result="1")},
    TimePassed: {"now_ms": 0},
    DrainRequested: {"now_ms": 0},
    CapacityChanged: {"now_ms": 0, "available": 1},
    Send: {"messages": (Heartbeat(capacity=1),)},
    RunHandler: {"offer": offer(1), "lease_deadline_ms": 1_000},
    SetLease: {"attempt_id": "a1", "lease_deadline_ms": 1_000},
    CancelHandler: {"attempt_id": "a1"},
    Notice: {"type": "draining"},
}
"""Every field of each event and command but its stimulus id."""


def test_every_event_and_command_is_listed_above() -> None:
    assert set(WITHOUT_STIMULUS_ID) == {*get_args(Event), *get_args(Command)}


@pytest.mark.parametrize(
    ("kind", "fields"),
    WITHOUT_STIMULUS_ID.items(),
    ids=[kind.__name__ for kind in WITHOUT_STIMULUS_ID],
)
def test_an_event_or_command_without_a_stimulus_id_cannot_be_made(
    kind: type[Event] | type[Command], fields: dict[str, Any]
) -> None:
    with pytest.raises(TypeError, match="stimulus_id"):
        kind(**fields)
    assert kind(**fields, stimulus_id="s1").stimulus_id == "s1"
