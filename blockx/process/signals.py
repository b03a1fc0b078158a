"""The signal rule every blockx server follows: the first SIGINT/SIGTERM drains, the second exits.

A worker and a hub both stop in two steps. The first signal asks for a drain
(no new work; what runs finishes, bounded by the server's own timeout); a
second one exits at once. A process manager that signals the whole process
group reaches both `uv run` and the server, and `uv run` forwards what it
got: the same signal again within `REPEAT_WINDOW_S` is that one request
delivered twice, not a second one.

`SignalRule` is the rule alone (no clock of its own, no signals); `watch_signals`
applies it to the process's real signals.
"""

from __future__ import annotations

import enum
import logging
import os
import signal
import sys
from typing import Final

import attrs
import trio

from blockx.process.lifecycle import remove_private_dirs

logger = logging.getLogger("blockx.process")

REPEAT_WINDOW_S: Final = 1.0
"""A repeat of the first signal within this long is the same request (a process manager
signalling the whole group reaches both `uv run` and the server, and `uv run` forwards
it), not a second one."""


class SignalAction(enum.Enum):
    DRAIN = "drain"
    """The first request to stop: drain."""
    REPEAT = "repeat"
    """The first signal again, at once: the same request, delivered twice."""
    EXIT = "exit"
    """A second request: exit at once."""


@attrs.define
class SignalRule:
    """What each SIGINT/SIGTERM asks for, given when it came (seconds, any clock)."""

    _first: tuple[int, float] | None = None

    def on_signal(self, signum: int, now_s: float) -> SignalAction:
        if self._first is None:
            self._first = (signum, now_s)
            return SignalAction.DRAIN
        first_signum, first_at = self._first
        if signum == first_signum and now_s - first_at < REPEAT_WINDOW_S:
            return SignalAction.REPEAT
        return SignalAction.EXIT


async def watch_signals(drain: trio.Event, draining: str = "shutting down") -> None:
    """Until cancelled: set `drain` at the first SIGINT/SIGTERM (logging `draining`), and
    exit the process at once at a second one (128 + its number), removing the private
    directories first (`remove_private_dirs`)."""
    rule = SignalRule()
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for signum in signals:
            name = signal.Signals(signum).name
            match rule.on_signal(signum, trio.current_time()):
                case SignalAction.DRAIN:
                    logger.info("%s: %s (send it again to exit at once)", name, draining)
                    drain.set()
                case SignalAction.REPEAT:
                    logger.info("%s again at once: the same request, still draining", name)
                case SignalAction.EXIT:
                    logger.warning("%s again: exiting at once", name)
                    remove_private_dirs()
                    sys.stderr.flush()
                    os._exit(128 + signum)
