"""The automatic worker's core and a lease that ends, whoever notices first.

The runtime cancels a handler on its lease deadline by itself (the lease
monitor), so the handler's return may reach the core before the core's own
timer for that deadline: the lease is lost either way, and said so.
"""

from __future__ import annotations

from blockx.autoworker import WorkerCore
from blockx.autoworker._core import (
    CancelHandler,
    Command,
    Connected,
    HandlerReturned,
    Notice,
    Received,
    Send,
    TimePassed,
)
from blockx.hubwire import (
    Capability,
    Finish,
    Granted,
    Offer,
    SessionOpened,
    Start,
    Unknown,
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


def sent(commands: list[Command]) -> list[object]:
    return [message for c in commands if isinstance(c, Send) for message in c.messages]


def finishes(commands: list[Command]) -> list[Finish]:
    return [message for message in sent(commands) if isinstance(message, Finish)]


def notices(commands: list[Command]) -> list[str]:
    return [c.type for c in commands if isinstance(c, Notice)]


def running_core() -> WorkerCore:
    """A core whose one attempt runs under a lease until `LEASE_DEADLINE_MS`."""
    core = WorkerCore(instance_id="w", queue_id="q", capabilities=(CAPABILITY,), capacity=1)
    [opening] = sent(core.handle(Connected(now_ms=0)))
    reply_to = opening.message_id  # type: ignore[attr-defined]
    core.handle(Received(now_ms=0, message=SessionOpened(reply_to=reply_to, session_ttl_ms=9_000)))
    [start] = sent(core.handle(Received(now_ms=0, message=OFFER)))
    assert isinstance(start, Start)
    granted = Granted(reply_to=start.message_id, attempt_id="a1", lease_deadline_ms=1_000)
    assert "started" in notices(core.handle(Received(now_ms=0, message=granted)))
    return core


def test_a_handler_cancelled_by_its_lease_monitor_loses_the_lease_before_its_timer() -> None:
    core = running_core()
    returned = HandlerReturned(
        now_ms=LEASE_DEADLINE_MS, attempt_id="a1", outcome=Unknown(code="LEASE_LOST")
    )
    commands = core.handle(returned)
    assert notices(commands) == ["lease_lost", "returned"]
    [finish] = finishes(commands)
    assert finish.outcome == Unknown(code="LEASE_LOST")
    assert core.running == 0


def test_the_timer_first_gives_the_same_notices_and_report() -> None:
    core = running_core()
    lost = core.handle(TimePassed(now_ms=LEASE_DEADLINE_MS))
    assert notices(lost) == ["lease_lost"]
    assert CancelHandler(attempt_id="a1") in lost
    commands = core.handle(
        HandlerReturned(
            now_ms=LEASE_DEADLINE_MS, attempt_id="a1", outcome=Unknown(code="HANDLER_ERROR")
        )
    )
    assert notices(commands) == ["returned"]
    [finish] = finishes(commands)
    assert finish.outcome == Unknown(code="LEASE_LOST")


def test_a_handler_that_returns_before_its_deadline_keeps_its_outcome() -> None:
    core = running_core()
    commands = core.handle(
        HandlerReturned(
            now_ms=LEASE_DEADLINE_MS - 1, attempt_id="a1", outcome=Unknown(code="HANDLER_ERROR")
        )
    )
    assert notices(commands) == ["returned"]
    [finish] = finishes(commands)
    assert finish.outcome == Unknown(code="HANDLER_ERROR")
