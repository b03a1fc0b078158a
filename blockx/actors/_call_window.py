"""How far a streamed task's reads may run ahead of its calls.

A streamed task (see `blockx.phases.builders.StreamingBuilder`) sends its
calls to the dispatcher in batches while its builder still reads. Its task
actor waits in `wait_for_room` before reading the next batch, and the
dispatcher says how many of the task's calls have ended (`ended_now`), so at
most `limit` calls (plus one batch) are ever sent and not ended: the rows a
scan holds stay bounded however large its source. Both sides run on the Trio
thread; nothing here blocks.
"""

from __future__ import annotations

import trio


class CallWindow:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.sent = 0
        self.ended = 0
        self.closed = False
        """The dispatcher no longer takes the task's calls (its call phase is over)."""
        self._room = trio.Event()

    def add(self, count: int) -> None:
        """`count` more calls are being sent (the task actor, as it posts them)."""
        self.sent += count

    def ended_now(self, ended: int) -> None:
        """`ended` of the task's calls have ended in all (the dispatcher, after each event)."""
        if ended != self.ended:
            self.ended = ended
            if self.sent - ended < self.limit:
                self._room.set()

    def close(self) -> None:
        self.closed = True
        self._room.set()

    async def wait_for_room(self) -> None:
        """Return once fewer than `limit` calls are in flight, or the window is closed."""
        while not self.closed and self.sent - self.ended >= self.limit:
            self._room = trio.Event()
            await self._room.wait()
