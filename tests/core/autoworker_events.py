"""Builders of events and hub messages for tests of the automatic worker's core.

Every event needs a stimulus id. The event builders below default to one naming
the kind of event; a test that asserts on commands passes its own, and finds it
on every command the event caused. Never reads a clock.
"""

from __future__ import annotations

from typing import Any

from blockx.autoworker._core import (
    Connected,
    Disconnected,
    DrainRequested,
    FromHub,
    HandlerReturned,
    Received,
    Send,
    Step,
    TimePassed,
    WorkerCore,
)
from blockx.hubwire import Capability, Offer, Outcome

CAP = Capability(handler="text.normalize", handler_version="v1", payload_version="v1")
OTHER = Capability(handler="text.normalize", handler_version="v2", payload_version="v1")


class WorkerCoreFactory:
    """Makes cores; checks them all at teardown (the `make_worker_core` fixture)."""

    def __init__(self) -> None:
        self.made: list[WorkerCore] = []

    def __call__(
        self, *, capacity: int = 2, capabilities: tuple[Capability, ...] = (CAP,)
    ) -> WorkerCore:
        core = WorkerCore(
            instance_id="i1", queue_id="q1", capabilities=capabilities, capacity=capacity
        )
        self.made.append(core)
        return core

    def check_all(self) -> None:
        for core in self.made:
            core.check_invariants()


def offer(
    n: int, *, deadline_ms: int = 10_000, epoch: int = 1, capability: Capability = CAP
) -> Offer:
    return Offer(
        attempt_id=f"a{n}",
        epoch=epoch,
        task_id=f"t{n}",
        capability=capability,
        payload='{"text": "x"}',
        offer_deadline_ms=deadline_ms,
        attempt_timeout_ms=60_000,
        task_deadline_ms=3_600_000,
    )


def connected(*, now_ms: int, stimulus_id: str = "connected") -> Connected:
    return Connected(now_ms=now_ms, stimulus_id=stimulus_id)


def disconnected(*, now_ms: int, stimulus_id: str = "disconnected") -> Disconnected:
    return Disconnected(now_ms=now_ms, stimulus_id=stimulus_id)


def received(message: FromHub, *, now_ms: int, stimulus_id: str = "received") -> Received:
    return Received(now_ms=now_ms, stimulus_id=stimulus_id, message=message)


def returned(
    attempt_id: str, outcome: Outcome, *, now_ms: int, stimulus_id: str = "returned"
) -> HandlerReturned:
    return HandlerReturned(
        now_ms=now_ms, stimulus_id=stimulus_id, attempt_id=attempt_id, outcome=outcome
    )


def time_passed(*, now_ms: int, stimulus_id: str = "tick") -> TimePassed:
    return TimePassed(now_ms=now_ms, stimulus_id=stimulus_id)


def drain_requested(*, now_ms: int, stimulus_id: str = "drain") -> DrainRequested:
    return DrainRequested(now_ms=now_ms, stimulus_id=stimulus_id)


def sent(step: Step) -> list[Any]:
    """The messages sent, typed loosely: tests check their type where it matters."""
    return [
        message
        for command in step.commands
        if isinstance(command, Send)
        for message in command.messages
    ]


def of_type(step: Step, kind: type) -> list[Any]:
    return [command for command in step.commands if isinstance(command, kind)]
