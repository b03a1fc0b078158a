"""Whether the worker can run calls: some executor is up, as the dispatcher saw last."""

from __future__ import annotations

import trio


class Readiness:
    """A flag the dispatcher actor sets as executors come and go, and that others follow.

    It starts false; the first executor up makes it true, the last one down false
    again (the pool's restarts bring it back). Followers wait with `wait_until`.
    """

    def __init__(self) -> None:
        self._ready = False
        self._changed = trio.Event()

    @property
    def ready(self) -> bool:
        return self._ready

    def set(self, ready: bool) -> None:
        if ready is self._ready:
            return
        self._ready = ready
        self._changed.set()
        self._changed = trio.Event()

    async def wait_until(self, ready: bool) -> None:
        """Return once the flag is `ready` (at once if it is)."""
        while self._ready is not ready:
            await self._changed.wait()
