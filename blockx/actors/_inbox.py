"""An actor's inbox as the others see it: post a message, or ask and wait for the answer.

An actor is one Trio task that owns some state and takes messages from one
inbox; nothing else touches its state. Inboxes have no size limit for
messages from other actors: their number is bounded by the tasks, streams and
calls that exist. Requests from clients are admitted at the edge instead
(the gRPC front end reads `waiting`), where a full backlog is refused rather
than queued.

A request that needs an answer carries its own `reply`: a plain function the
actor calls exactly once, with the answer or with the `WorkerError` that
refuses the request. The actor never waits for whoever asked, so an asyncio
handler (the gRPC front end) and a Trio task (`ask`) can both wait on it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Final, Generic, TypeAlias, TypeVar

import trio

from blockx.slots import WorkerError

M = TypeVar("M")
T = TypeVar("T")
Reply: TypeAlias = Callable[[T | WorkerError], None]

BATCH: Final = 256
"""Messages an actor takes per wake-up before it looks at its clock again."""


class Inbox(Generic[M]):
    """The sending side of one actor's inbox; `receive` is the side its actor takes from."""

    def __init__(self) -> None:
        self._send, self.receive = trio.open_memory_channel[M](math.inf)

    @property
    def sender(self) -> trio.MemorySendChannel[M]:
        """The sending side itself, for a producer that takes a channel (the executor pool)."""
        return self._send

    def post(self, message: M) -> None:
        """From another actor: always taken, never waits."""
        self._send.send_nowait(message)

    @property
    def waiting(self) -> int:
        """Messages posted and not taken yet (safe to read from any thread)."""
        return self._send.statistics().current_buffer_used

    async def ask(self, make: Callable[[Reply[T]], M]) -> T:
        """Post `make(reply)` and wait for the answer; a `WorkerError` answer is raised."""
        answered = trio.Event()
        answers: list[T | WorkerError] = []

        def reply(answer: T | WorkerError) -> None:
            if not answers:
                answers.append(answer)
                answered.set()

        self.post(make(reply))
        await answered.wait()
        answer = answers[0]
        if isinstance(answer, WorkerError):
            raise answer
        return answer


async def take_until(
    receive: trio.MemoryReceiveChannel[M], deadline: float, handle: Callable[[M], None]
) -> bool:
    """Wait for a message until Trio time `deadline`; `handle` it and up to `BATCH` more
    that are already waiting. False when the deadline came first (nothing was taken).

    A busy actor finds its next message waiting: it is taken without a cancel scope,
    and the actor lets the others run once the batch is handled."""
    if trio.current_time() < deadline:
        try:
            message = receive.receive_nowait()
        except trio.WouldBlock:
            pass
        else:
            _handle_batch(receive, message, handle)
            await trio.lowlevel.checkpoint()
            return True
    with trio.move_on_at(deadline):
        _handle_batch(receive, await receive.receive(), handle)
        return True
    return False


def _handle_batch(
    receive: trio.MemoryReceiveChannel[M], first: M, handle: Callable[[M], None]
) -> None:
    handle(first)
    for _ in range(BATCH):
        try:
            message = receive.receive_nowait()
        except trio.WouldBlock:
            break
        handle(message)
