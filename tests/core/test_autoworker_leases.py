"""The automatic worker's core and a lease that ends, whoever notices first.

The runtime cancels a handler on its lease deadline by itself (the lease
monitor), so the handler's return may reach the core before the core's own
timer for that deadline: the lease is lost either way, and said so.
"""

from __future__ import annotations

from blockx.autoworker import WorkerCore
from blockx.autoworker._core import CancelHandler, Notice, Step
from blockx.hubwire import (
    Capability,
    Finish,
    Granted,
    Offer,
    SessionOpened,
    Start,
    Unknown,
)
from tests.core.autoworker_events import (
    WorkerCoreFactory,
    connected,
    received,
    returned,
    sent,
    time_passed,
)

CAPABILITY = Capability(handler="h", handler_version="1", payload_version="1")
OFFER = Offer(
    attempt_id="a1",
    epoch=1,
    task_id="t1",
    capability=CAPABILITY,
    payload="{}",
    offer_deadline_ms=5_000,
    attempt_timeout_ms=60_000,
    task_deadline_ms=60_000,
)
LEASE_DEADLINE_MS = 1_000


def finishes(step: Step) -> list[Finish]:
    return [message for message in sent(step) if isinstance(message, Finish)]


def notices(step: Step) -> list[str]:
    return [c.type for c in step.commands if isinstance(c, Notice)]


def running_core(make_worker_core: WorkerCoreFactory) -> WorkerCore:
    """A core whose one attempt runs under a lease until `LEASE_DEADLINE_MS`."""
    core = make_worker_core(capabilities=(CAPABILITY,), capacity=1)
    [opening] = sent(core.handle(connected(now_ms=0)))
    opened = SessionOpened(reply_to=opening.message_id, session_ttl_ms=9_000)
    core.handle(received(opened, now_ms=0))
    [start] = sent(core.handle(received(OFFER, now_ms=0)))
    assert isinstance(start, Start)
    granted = Granted(reply_to=start.message_id, attempt_id="a1", lease_deadline_ms=1_000)
    assert "started" in notices(core.handle(received(granted, now_ms=0)))
    return core


def test_a_handler_cancelled_by_its_lease_monitor_loses_the_lease_before_its_timer(
    make_worker_core: WorkerCoreFactory,
) -> None:
    core = running_core(make_worker_core)
    commands = core.handle(returned("a1", Unknown(code="LEASE_LOST"), now_ms=LEASE_DEADLINE_MS))
    assert notices(commands) == ["lease_lost", "returned"]
    [finish] = finishes(commands)
    assert finish.outcome == Unknown(code="LEASE_LOST")
    assert core.running == 0


def test_the_timer_first_gives_the_same_notices_and_report(
    make_worker_core: WorkerCoreFactory,
) -> None:
    core = running_core(make_worker_core)
    lost = core.handle(time_passed(now_ms=LEASE_DEADLINE_MS, stimulus_id="lease-timer"))
    assert notices(lost) == ["lease_lost"]
    assert CancelHandler(attempt_id="a1", stimulus_id="lease-timer") in lost.commands
    commands = core.handle(returned("a1", Unknown(code="HANDLER_ERROR"), now_ms=LEASE_DEADLINE_MS))
    assert notices(commands) == ["returned"]
    [finish] = finishes(commands)
    assert finish.outcome == Unknown(code="LEASE_LOST")


def test_a_handler_that_returns_before_its_deadline_keeps_its_outcome(
    make_worker_core: WorkerCoreFactory,
) -> None:
    core = running_core(make_worker_core)
    commands = core.handle(
        returned("a1", Unknown(code="HANDLER_ERROR"), now_ms=LEASE_DEADLINE_MS - 1)
    )
    assert notices(commands) == ["returned"]
    [finish] = finishes(commands)
    assert finish.outcome == Unknown(code="HANDLER_ERROR")
