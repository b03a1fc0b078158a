"""The automatic worker's rules, event by event (`blockx.autoworker._core`)."""

from __future__ import annotations

import pytest

from blockx.autoworker._core import (
    MAX_HEARTBEAT_MS,
    MIN_RENEW_MS,
    CancelHandler,
    Connected,
    Disconnected,
    DrainRequested,
    HandlerReturned,
    Link,
    Notice,
    Phase,
    Received,
    RunHandler,
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
from tests.core.autoworker_events import CAP, OTHER, of_type, offer, sent

TTL_MS = 15_000


def core(capacity: int = 2) -> WorkerCore:
    return WorkerCore(instance_id="i1", queue_id="q1", capabilities=(CAP,), capacity=capacity)


def opened(machine: WorkerCore, now_ms: int = 0) -> None:
    """Connect and open the session (no attempt known)."""
    [opening] = sent(machine.handle(Connected(now_ms=now_ms)))
    assert isinstance(opening, OpenSession)
    reply = SessionOpened(reply_to=opening.message_id, session_ttl_ms=TTL_MS)
    machine.handle(Received(now_ms=now_ms, message=reply))
    assert machine.link is Link.OPEN


def started(machine: WorkerCore, n: int, *, now_ms: int = 0, lease_ms: int = 3_000) -> Start:
    """Offer attempt `n` and grant its start; returns the start."""
    [start] = sent(machine.handle(Received(now_ms=now_ms, message=offer(n))))
    assert isinstance(start, Start)
    granted = Granted(
        reply_to=start.message_id, attempt_id=start.attempt_id, lease_deadline_ms=now_ms + lease_ms
    )
    commands = machine.handle(Received(now_ms=now_ms, message=granted))
    assert of_type(commands, RunHandler)
    return start


def test_a_session_opens_with_the_capacity_and_offers_start_up_to_it() -> None:
    machine = core(capacity=2)
    [opening] = sent(machine.handle(Connected(now_ms=0)))
    assert isinstance(opening, OpenSession)
    assert (opening.capacity, opening.capabilities, opening.queue_id) == (2, (CAP,), "q1")
    assert machine.link is Link.OPENING
    machine.handle(
        Received(
            now_ms=2, message=SessionOpened(reply_to=opening.message_id, session_ttl_ms=TTL_MS)
        )
    )
    starts = [sent(machine.handle(Received(now_ms=3, message=offer(n)))) for n in (1, 2, 3)]
    assert [[type(m) for m in s] for s in starts] == [[Start], [Start], []]  # no third slot
    assert machine.phase_of("a3") is Phase.OFFERED


def test_a_handler_runs_only_once_its_start_is_granted_and_only_once() -> None:
    machine = core()
    opened(machine)
    [start] = sent(machine.handle(Received(now_ms=0, message=offer(1))))
    assert isinstance(start, Start)
    assert machine.running == 0
    granted = Granted(reply_to=start.message_id, attempt_id="a1", lease_deadline_ms=3_000)
    commands = machine.handle(Received(now_ms=10, message=granted))
    assert of_type(commands, RunHandler) == [RunHandler(offer=offer(1), lease_deadline_ms=3_000)]
    again = machine.handle(Received(now_ms=11, message=granted))  # a duplicate answer
    assert of_type(again, RunHandler) == []
    assert machine.handle(Received(now_ms=12, message=offer(1))) == []  # a repeated offer
    assert machine.counters.started == 1


def test_a_refused_start_forgets_the_attempt_and_frees_its_slot() -> None:
    machine = core(capacity=1)
    opened(machine)
    [start] = sent(machine.handle(Received(now_ms=0, message=offer(1))))
    machine.handle(Received(now_ms=0, message=offer(2)))
    refused = Refused(
        reply_to=start.message_id, attempt_id="a1", code=RefusalCode.NOT_OFFERED, message="gone"
    )
    commands = machine.handle(Received(now_ms=5, message=refused))
    assert machine.phase_of("a1") is None
    assert [type(m) for m in sent(commands)] == [Start]  # the waiting offer takes the slot
    assert machine.phase_of("a2") is Phase.STARTING


def test_offers_beyond_twice_the_capacity_and_of_other_capabilities_are_not_kept() -> None:
    machine = core(capacity=2)
    opened(machine)
    for n in range(1, 7):
        machine.handle(Received(now_ms=0, message=offer(n)))
    assert machine.known == 4
    commands = machine.handle(Received(now_ms=0, message=offer(9, capability=OTHER)))
    assert machine.phase_of("a9") is None
    assert [n.detail for n in of_type(commands, Notice)] == ["capability"]


def test_an_offer_not_started_by_its_deadline_is_dropped() -> None:
    machine = core(capacity=1)
    opened(machine)
    started(machine, 1)
    machine.handle(Received(now_ms=0, message=offer(2, deadline_ms=500)))
    assert machine.next_deadline_ms() == 500
    machine.handle(TimePassed(now_ms=500))
    assert machine.phase_of("a2") is None


def test_heartbeats_go_every_third_of_the_session_ttl_at_most_five_seconds() -> None:
    machine = core()
    [opening] = sent(machine.handle(Connected(now_ms=0)))
    machine.handle(
        Received(now_ms=0, message=SessionOpened(reply_to=opening.message_id, session_ttl_ms=3_000))
    )
    assert machine.next_deadline_ms() == 1_000
    assert sent(machine.handle(TimePassed(now_ms=1_000))) == [Heartbeat(capacity=2)]
    assert machine.next_deadline_ms() == 2_000
    long = core()
    [opening] = sent(long.handle(Connected(now_ms=0)))
    long.handle(
        Received(
            now_ms=0, message=SessionOpened(reply_to=opening.message_id, session_ttl_ms=60_000)
        )
    )
    assert long.next_deadline_ms() == MAX_HEARTBEAT_MS


@pytest.mark.parametrize(("lease_ms", "due_ms"), [(3_000, 1_000), (30, MIN_RENEW_MS)])
def test_a_renew_is_due_a_third_into_the_remaining_lease_never_under_20_ms(
    lease_ms: int, due_ms: int
) -> None:
    machine = core()
    opened(machine)
    started(machine, 1, lease_ms=lease_ms)
    assert machine.next_deadline_ms() == due_ms
    [renew] = sent(machine.handle(TimePassed(now_ms=due_ms)))
    assert isinstance(renew, Renew)
    assert (renew.attempt_id, renew.epoch) == ("a1", 1)


def test_a_renewed_lease_is_taken_as_the_hub_gives_it_even_shorter() -> None:
    machine = core()
    opened(machine)
    started(machine, 1, lease_ms=3_000)
    [renew] = sent(machine.handle(TimePassed(now_ms=1_000)))
    shorter = Granted(reply_to=renew.message_id, attempt_id="a1", lease_deadline_ms=2_000)
    commands = machine.handle(Received(now_ms=1_010, message=shorter))
    assert of_type(commands, SetLease) == [SetLease(attempt_id="a1", lease_deadline_ms=2_000)]
    assert machine.lease_of("a1") == 2_000
    assert machine.counters.renewals_confirmed == 1


def test_a_lease_that_ran_out_cancels_the_handler_and_a_late_grant_does_not_revive_it() -> None:
    machine = core()
    opened(machine)
    started(machine, 1, lease_ms=3_000)
    [renew] = sent(machine.handle(TimePassed(now_ms=1_000)))
    commands = machine.handle(TimePassed(now_ms=3_000))  # the renew was never answered
    assert of_type(commands, CancelHandler) == [CancelHandler(attempt_id="a1")]
    assert machine.phase_of("a1") is Phase.LOST
    late = Granted(reply_to=renew.message_id, attempt_id="a1", lease_deadline_ms=6_000)
    assert of_type(machine.handle(Received(now_ms=3_001, message=late)), SetLease) == []
    assert machine.phase_of("a1") is Phase.LOST
    # The cancelled handler's report is LEASE_LOST, whatever it raised.
    returned = machine.handle(
        HandlerReturned(now_ms=3_002, attempt_id="a1", outcome=Unknown(code="HANDLER_ERROR"))
    )
    [finish] = [m for m in sent(returned) if isinstance(m, Finish)]
    assert finish.outcome == Unknown(code="LEASE_LOST")


def test_a_lost_handler_still_running_lowers_the_declared_capacity() -> None:
    machine = core(capacity=2)
    opened(machine)
    started(machine, 1, lease_ms=3_000)
    machine.handle(TimePassed(now_ms=1_000))  # the renew goes out, never answered
    commands = machine.handle(TimePassed(now_ms=3_000))
    assert of_type(commands, CancelHandler) == [CancelHandler(attempt_id="a1")]
    assert sent(commands) == [Heartbeat(capacity=1)]  # the cancelled handler holds its slot
    returned = machine.handle(
        HandlerReturned(now_ms=3_500, attempt_id="a1", outcome=Succeeded(result="1"))
    )
    [finish, heartbeat] = sent(returned)
    assert isinstance(finish, Finish)
    assert finish.outcome == Succeeded(result="1")  # sent as it is: the hub keeps evidence
    assert heartbeat == Heartbeat(capacity=2)


def test_a_reconnect_resumes_before_offering_capacity_and_resends_with_the_same_ids() -> None:
    machine = core(capacity=2)
    opened(machine)
    started(machine, 1)
    [start2] = sent(machine.handle(Received(now_ms=0, message=offer(2))))
    finish = sent(
        machine.handle(HandlerReturned(now_ms=50, attempt_id="a1", outcome=Succeeded(result="1")))
    )
    machine.handle(Disconnected(now_ms=60))
    assert machine.declared_capacity() == 1  # a result unconfirmed across the loss

    [opening] = sent(machine.handle(Connected(now_ms=100)))
    assert isinstance(opening, OpenSession)
    assert opening.capacity == 0  # attempts are known: resume first
    [resume] = sent(
        machine.handle(
            Received(
                now_ms=110,
                message=SessionOpened(reply_to=opening.message_id, session_ttl_ms=TTL_MS),
            )
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
        Received(now_ms=120, message=Resumed(reply_to=resume.message_id, attempts=statuses))
    )
    resent = sent(commands)
    assert resent[:2] == [start2, *finish]  # the original messages, ids and all
    assert resent[2:] == [Heartbeat(capacity=1)]
    assert machine.counters.reconnects == 1


def test_a_start_granted_while_the_answer_was_lost_runs_under_the_resumed_lease() -> None:
    machine = core()
    opened(machine)
    [start] = sent(machine.handle(Received(now_ms=0, message=offer(1))))
    machine.handle(Disconnected(now_ms=10))
    [opening] = sent(machine.handle(Connected(now_ms=20)))
    [resume] = sent(
        machine.handle(
            Received(
                now_ms=20, message=SessionOpened(reply_to=opening.message_id, session_ttl_ms=TTL_MS)
            )
        )
    )
    running = ResumedAttempt(
        attempt_id="a1", epoch=1, status=AttemptStatus.RUNNING, lease_deadline_ms=4_000
    )
    commands = machine.handle(
        Received(now_ms=30, message=Resumed(reply_to=resume.message_id, attempts=(running,)))
    )
    assert of_type(commands, RunHandler) == [RunHandler(offer=offer(1), lease_deadline_ms=4_000)]
    assert start not in sent(commands)  # no need to ask again


def test_resume_finding_an_attempt_lost_cancels_its_handler() -> None:
    machine = core()
    opened(machine)
    started(machine, 1)
    machine.handle(Disconnected(now_ms=10))
    [opening] = sent(machine.handle(Connected(now_ms=20)))
    [resume] = sent(
        machine.handle(
            Received(
                now_ms=20, message=SessionOpened(reply_to=opening.message_id, session_ttl_ms=TTL_MS)
            )
        )
    )
    lost = ResumedAttempt(attempt_id="a1", epoch=1, status=AttemptStatus.LOST)
    commands = machine.handle(
        Received(now_ms=30, message=Resumed(reply_to=resume.message_id, attempts=(lost,)))
    )
    assert of_type(commands, CancelHandler) == [CancelHandler(attempt_id="a1")]


def test_recorded_settles_the_attempt_and_counts_evidence() -> None:
    machine = core()
    opened(machine)
    started(machine, 1)
    [finish] = sent(
        machine.handle(HandlerReturned(now_ms=5, attempt_id="a1", outcome=Succeeded(result="1")))
    )
    assert isinstance(finish, Finish)
    recorded = Recorded(
        reply_to=finish.message_id, attempt_id="a1", disposition=Disposition.EVIDENCE_ONLY
    )
    machine.handle(Received(now_ms=6, message=recorded))
    assert machine.phase_of("a1") is None
    assert (machine.counters.reports_confirmed, machine.counters.evidence_confirmed) == (1, 1)


def test_a_drain_stops_starts_finishes_what_runs_and_ends_drained() -> None:
    machine = core(capacity=1)
    opened(machine)
    started(machine, 1)
    machine.handle(Received(now_ms=0, message=offer(2)))
    drain, *_ = sent(machine.handle(DrainRequested(now_ms=10)))
    assert isinstance(drain, Drain)
    assert machine.phase_of("a2") is None  # never started: left to lapse
    assert sent(machine.handle(Received(now_ms=11, message=offer(3)))) == []
    machine.handle(
        Received(now_ms=12, message=DrainAck(reply_to=drain.message_id, offered=("a2",)))
    )
    assert not machine.drained()  # a1 still runs
    [finish] = sent(
        machine.handle(HandlerReturned(now_ms=20, attempt_id="a1", outcome=Succeeded(result="1")))
    )
    assert isinstance(finish, Finish)
    machine.handle(
        Received(
            now_ms=21,
            message=Recorded(
                reply_to=finish.message_id, attempt_id="a1", disposition=Disposition.ACCEPTED
            ),
        )
    )
    assert machine.drained()


def test_misuse_is_refused() -> None:
    machine = core()
    opened(machine)
    with pytest.raises(Misuse):
        machine.handle(Connected(now_ms=1))
    with pytest.raises(Misuse):
        machine.handle(HandlerReturned(now_ms=1, attempt_id="nope", outcome=Succeeded(result="1")))


def test_an_attempt_settled_here_is_never_run_again_if_offered_again() -> None:
    machine = core()
    opened(machine)
    started(machine, 1)
    [finish] = sent(
        machine.handle(HandlerReturned(now_ms=5, attempt_id="a1", outcome=Succeeded(result="1")))
    )
    recorded = Recorded(
        reply_to=finish.message_id, attempt_id="a1", disposition=Disposition.ACCEPTED
    )
    machine.handle(Received(now_ms=6, message=recorded))
    assert machine.handle(Received(now_ms=7, message=offer(1))) == []
    assert machine.phase_of("a1") is None
