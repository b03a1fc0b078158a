"""Where grpclib's loop runs, and how its handlers and the Trio actors hand work to each other.

Two arrangements (`grpcLoop`):

* "thread" (the default): grpclib on uvloop in a thread of its own. The gRPC
  and HTTP/2 work runs there, beside the actors in `trio.run`, and uvloop
  schedules it in C. Measured with bench/serve.py (medians of 8 alternating
  runs, 2 cores): worker CPU per unary task 1.97 ms against 2.76 ms on
  trio-asyncio, unary tasks/s 374 against 272, latency p50 4.3 against 5.2 ms.
* "trio-asyncio": grpclib on trio-asyncio's loop inside the one `trio.run`.
  What a test on a virtual clock (`MockClock`) asks for: work on another
  thread is invisible to Trio, so the clock would jump while a request is
  being served.

The setting is used as given, never switched for the clock in use: "thread"
under a `MockClock` is refused (`ThreadLoopUnderVirtualClock`), not replaced.

Handlers reach the actors only through a `Bridge`: `to_trio(fn, *args)` runs
`fn(*args)` on the Trio thread, `to_loop(fn, *args)` on the loop's. On one
thread both call at once (`InlineBridge`). Across threads (`ThreadBridge`)
calls queue under a lock and only the call that finds its queue empty wakes
the other thread, which then runs every call queued by then: a busy side is
not woken once per message. What both sides touch besides (the watch
streams) takes a lock of its own.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import sys
import threading
from collections.abc import Callable, Coroutine
from typing import Any, Protocol, TypeVar

import trio
import uvloop

from blockx.api._affinity import pin_this_thread
from blockx.errors import Misuse

logger = logging.getLogger("blockx.api")

T = TypeVar("T")


class Bridge(Protocol):
    def to_trio(self, fn: Callable[..., object], /, *args: Any) -> None: ...

    def to_loop(self, fn: Callable[..., object], /, *args: Any) -> None: ...


class InlineBridge:
    """Both sides on one thread: a hand-over is a call."""

    def to_trio(self, fn: Callable[..., object], /, *args: Any) -> None:
        fn(*args)

    def to_loop(self, fn: Callable[..., object], /, *args: Any) -> None:
        fn(*args)


class _Queue:
    """`call(fn, *args)` from any thread; `fn(*args)` runs where `schedule` sends `_run`."""

    def __init__(self, schedule: Callable[[Callable[[], None]], object], name: str) -> None:
        self._schedule = schedule
        self._name = name
        self._lock = threading.Lock()
        self._pending: list[tuple[Callable[..., object], tuple[Any, ...]]] = []
        self._scheduled = False

    def call(self, fn: Callable[..., object], /, *args: Any) -> None:
        with self._lock:
            self._pending.append((fn, args))
            if self._scheduled:
                return
            self._scheduled = True
        try:
            self._schedule(self._run)
        except RuntimeError:  # the other side has ended (its loop closed, trio.run over)
            logger.debug("%s: the other thread is gone; a hand-over was dropped", self._name)

    def _run(self) -> None:
        with self._lock:
            batch, self._pending = self._pending, []
            self._scheduled = False
        for fn, args in batch:
            try:
                fn(*args)
            except Exception:  # one bad hand-over must not lose the others queued with it
                logger.exception("%s: a hand-over failed", self._name)


class ThreadBridge:
    """Between the Trio thread (`token`) and the loop thread (`loop`)."""

    def __init__(self, token: trio.lowlevel.TrioToken, loop: asyncio.AbstractEventLoop) -> None:
        self.to_trio = _Queue(token.run_sync_soon, "to trio").call
        self.to_loop = _Queue(loop.call_soon_threadsafe, "to the gRPC loop").call


class ThreadLoopUnderVirtualClock(Misuse):
    """grpcLoop "thread" was asked for in a `trio.run` on a virtual clock."""

    def __init__(self) -> None:
        super().__init__(
            what='grpcLoop "thread" cannot run under a virtual clock (trio.testing.MockClock): '
            "the clock cannot see the server's thread, so its time would jump while a "
            'request is served; on a virtual clock, set grpcLoop "trio-asyncio"'
        )


def check_arrangement(setting: str) -> None:
    """Refuse `setting` "thread" under a virtual clock, rather than run another arrangement
    than the one asked for."""
    # A MockClock exists only once trio.testing is imported; importing it here would load
    # it, and pytest with it, into every worker.
    testing = sys.modules.get("trio.testing")
    clock = trio.lowlevel.current_clock()
    if setting == "thread" and testing is not None and isinstance(clock, testing.MockClock):
        raise ThreadLoopUnderVirtualClock()


class LoopThread:
    """A uvloop event loop running in its own daemon thread (pinned to `cpu` if given)."""

    def __init__(self, *, cpu: int | None = None) -> None:
        self._cpu = cpu
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None
        self.loop: asyncio.AbstractEventLoop | None = None

    async def start(self) -> asyncio.AbstractEventLoop:
        self._thread = threading.Thread(target=self._main, name="grpc-loop", daemon=True)
        self._thread.start()
        await trio.to_thread.run_sync(self._ready.wait)
        assert self.loop is not None
        return self.loop

    def _main(self) -> None:
        if self._cpu is not None:
            pin_this_thread(self._cpu)
        loop = uvloop.new_event_loop()
        asyncio.set_event_loop(loop)
        self.loop = loop
        self._ready.set()
        try:
            loop.run_forever()
            tasks = asyncio.all_tasks(loop)
            for task in tasks:
                task.cancel()
            if tasks:
                loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            loop.close()

    async def run(self, make: Callable[[], Coroutine[Any, Any, T]]) -> T:
        """Run the coroutine `make()` on the loop and wait (in Trio) for its result;
        cancelled in Trio, the coroutine is cancelled too."""
        assert self.loop is not None
        token = trio.lowlevel.current_trio_token()
        done = trio.Event()
        future: concurrent.futures.Future[T] = asyncio.run_coroutine_threadsafe(make(), self.loop)

        def finished(_: object) -> None:
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(done.set)

        future.add_done_callback(finished)
        try:
            await done.wait()
        except trio.Cancelled:
            future.cancel()
            raise
        return future.result()

    def stop_now(self, timeout_s: float, *, first: Callable[[], object] = lambda: None) -> None:
        """`close` without Trio, for a worker cancelled before it could close: call
        `first` on the loop, stop it and wait up to `timeout_s` for the thread (blocking)."""
        if self.loop is None or self._thread is None:
            return
        with contextlib.suppress(RuntimeError):  # already closed
            self.loop.call_soon_threadsafe(first)
            self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout_s)

    async def close(self) -> None:
        """Stop the loop (cancelling what still runs on it) and wait for the thread."""
        if self.loop is None or self._thread is None:
            return
        with contextlib.suppress(RuntimeError):  # already closed
            self.loop.call_soon_threadsafe(self.loop.stop)
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(self._thread.join)
