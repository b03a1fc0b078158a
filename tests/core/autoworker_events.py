"""Builders of hub messages for tests of the automatic worker's core."""

from __future__ import annotations

from typing import Any

from blockx.autoworker._core import Command, Send
from blockx.hubwire import Capability, Offer

CAP = Capability(handler="text.normalize", handler_version="v1", payload_version="v1")
OTHER = Capability(handler="text.normalize", handler_version="v2", payload_version="v1")


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


def sent(commands: list[Command]) -> list[Any]:
    """The messages sent, typed loosely: tests check their type where it matters."""
    return [
        message for command in commands if isinstance(command, Send) for message in command.messages
    ]


def of_type(commands: list[Command], kind: type) -> list[Any]:
    return [command for command in commands if isinstance(command, kind)]
