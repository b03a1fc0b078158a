"""The executor pool manager: spawns, watches, restarts and stops executor processes.

Owns the private runtime directory (mode 0700) and its Unix socket, the
executor processes and their connections, each executor's health and restart
window, and the `first_healthy` signal. It answers nothing but Hello: every
other message goes to the dispatcher as a pool event on the channel it was
made with (the dispatcher's inbox, which has no size limit: the events in
flight are bounded by the calls the dispatcher gave out), and the dispatcher
decides which executor runs what (`send`). It implements `ExecutorTransport`.

Theory of operation. Each executor id has one supervisor task that runs one
*incarnation* (process) at a time: spawn with a fresh token, wait for an
authenticated Hello, send Welcome, then read and forward until the process
ends; then the restart policy decides when the next incarnation starts. A
health task judges every connected executor on a timer (`assess_health`) and
kills the LOST and the WEDGED; their incarnation then ends like any other.
`ExecutorDown` is sent only after the process is dead and reaped, so a call
reported lost can never still be running.

Must never leave a process unreaped or unkilled: every incarnation kills and
waits for its process in a shielded `finally`, on stop, on cancellation and
on error.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import shutil
import socket
import subprocess
import tempfile
from typing import Final

import attrs
import trio

from blockx.errors import Misuse, shown
from blockx.executors._config import ExecutorPoolConfig
from blockx.executors._errors import (
    ExecutorUnavailable,
    ProtocolViolation,
    RuntimeDirError,
    SendQueueFull,
    UnknownExecutor,
    WireError,
)
from blockx.executors._health import RestartWindow, assess_health
from blockx.executors._model import (
    DownReason,
    ExecutorDown,
    ExecutorMessage,
    ExecutorState,
    ExecutorUp,
    ExecutorView,
    PoolEvent,
)
from blockx.executors._wire import (
    MAX_FRAME_BYTES,
    PROTOCOL_VERSION,
    RECV_BYTES,
    TOKEN_ENV,
    CallResults,
    CodeRequest,
    FrameDecoder,
    Heartbeat,
    Hello,
    Shutdown,
    Subcall,
    ToExecutor,
    Welcome,
    encode_frame,
)
from blockx.process.clock import EpochClock
from blockx.process.lifecycle import add_private_dir, discard_private_dir

logger = logging.getLogger("blockx.executors")

CHILD_MODULE: Final = "blockx.executors.child"
SOCKET_NAME: Final = "executors.sock"
_MAX_SOCKET_PATH_BYTES: Final = 107  # sun_path is 108 bytes with its NUL
_HELLO_MAX_FRAME_BYTES: Final = 64 * 1024  # before authentication, frames stay small
_WRITE_BATCH_BYTES: Final = 1024 * 1024
_EXIT_AFTER_EOF_S: Final = 1.0
"""After its connection ends, a process gets this long to exit before it is killed."""

_REASON_CHARS: Final = 300
_NO_HELLO_IN_TIME: Final = object()
_CLOSED_FIRST: Final = object()
"""What a connection sent first, when it was not a message: nothing in time, or nothing
before it closed."""

_STATE_OF_REASON: Final = {
    DownReason.LOST: ExecutorState.LOST,
    DownReason.WEDGED: ExecutorState.WEDGED,
    DownReason.EXITED: ExecutorState.EXITED,
}


@attrs.define(eq=False)
class _Incarnation:
    """One process behind an executor id, from spawn to reap."""

    process: trio.Process
    token: str
    cancel_scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    connected: trio.Event = attrs.field(factory=trio.Event)
    exited: trio.Event = attrs.field(factory=trio.Event)
    stream: trio.SocketStream | None = None
    decoder: FrameDecoder | None = None
    frames: trio.MemorySendChannel[bytes] | None = None
    direct: socket.socket | None = None
    """The connection as a plain non-blocking socket, for a frame sent at once (`send_frame`)."""
    unsent: int = 0
    """Frames queued for the write loop and not sent yet (in the queue or in its hands)."""
    up: bool = False
    last_heartbeat_at_ms: int = 0
    heartbeat: Heartbeat | None = None
    down_reason: DownReason | None = None

    def queue(self, frame: bytes) -> None:
        """Hand `frame` to the write loop, behind every frame queued before it. Raises as
        `send_nowait` does: WouldBlock when full, ClosedResourceError when not connected."""
        if self.frames is None:
            raise trio.ClosedResourceError
        self.frames.send_nowait(frame)
        self.unsent += 1

    def going_down(self, reason: DownReason) -> None:
        """Record why this incarnation ends; the first reason wins."""
        if self.down_reason is None:
            self.down_reason = reason


@attrs.define(eq=False)
class _Executor:
    """One executor id: its current incarnation and what outlives incarnations."""

    executor_id: str
    window: RestartWindow
    state: ExecutorState = ExecutorState.STARTING
    incarnation: _Incarnation | None = None
    pid: int | None = None
    rss_bytes: int = 0
    calls_served: int = 0
    restarts: int = 0
    running_call_id: str | None = None


def _send_at_once(incarnation: _Incarnation, frame: bytes) -> bool:
    """Send `frame` now, when nothing is queued before it and the socket takes it whole;
    False: it must go through the write loop (what was sent of it is not repeated)."""
    direct = incarnation.direct
    if direct is None or incarnation.unsent:
        return False
    try:
        sent = direct.send(frame)
    except OSError:  # full (BlockingIOError) or broken: the write loop deals with it
        return False
    if sent < len(frame):
        with contextlib.suppress(trio.ClosedResourceError, trio.BrokenResourceError):
            incarnation.queue(frame[sent:])  # the rest, first in line: the queue was empty
    return True  # (a closed queue: the connection is going down, its calls with it)


class ExecutorPoolManager:
    """Starts `config.executor_count` executor processes and keeps them running.

    Start with `await nursery.start(manager.run)`; end with `await manager.stop()`
    (polite) or by cancelling the nursery (immediate kill). ExecutorUp /
    ExecutorDown / ExecutorMessage go to `events` (a channel without a size
    limit, never closed here); `send` writes to one executor.
    """

    def __init__(
        self,
        config: ExecutorPoolConfig,
        events: trio.MemorySendChannel[PoolEvent],
        clock: EpochClock,
    ) -> None:
        self.config = config
        self._events = events
        self._clock = clock
        self._first_healthy = trio.Event()
        c = self.config
        self._executors = {
            executor_id: _Executor(
                executor_id=executor_id,
                window=RestartWindow(
                    delay_ms=c.restart_delay_ms,
                    max_restarts=c.max_restarts,
                    window_ms=c.restart_window_ms,
                    backoff_ms=c.restart_backoff_ms,
                ),
            )
            for executor_id in (f"executor-{i}" for i in range(c.executor_count))
        }
        self.executor_ids: tuple[str, ...] = tuple(self._executors)
        self.runtime_dir: str | None = None
        self._socket_path = ""
        self._started = False
        self._stop_requested = trio.Event()
        self._run_scope = trio.CancelScope()
        self._finished = trio.Event()

    # --- the dispatcher's API -------------------------------------------------------------

    @property
    def first_healthy(self) -> trio.Event:
        """Set when any executor first becomes READY (worker readiness)."""
        return self._first_healthy

    def send(self, executor_id: str, message: ToExecutor) -> None:
        """Queue `message` for `executor_id` without waiting.

        Raises UnknownExecutor, ExecutorUnavailable (not connected), SendQueueFull,
        or FrameTooLarge (the message cannot be one frame).
        """
        self.send_frame(executor_id, encode_frame(message))

    def send_frame(self, executor_id: str, frame: bytes, *, at_once: bool = False) -> None:
        """Queue an already encoded frame (see `encode_run_calls_frame`); as `send`.
        With `at_once`, a frame nothing is queued before goes out now, on this step: the
        write loop would take a step of its own to send it."""
        executor = self._executors.get(executor_id)
        if executor is None:
            raise UnknownExecutor(executor_id=executor_id, known=self.executor_ids)
        incarnation = executor.incarnation
        if (
            incarnation is None
            or incarnation.frames is None
            or incarnation.down_reason is not None
            or self._stop_requested.is_set()
        ):
            raise ExecutorUnavailable(executor_id=executor_id, state=executor.state.value)
        if at_once and _send_at_once(incarnation, frame):
            return
        try:
            incarnation.queue(frame)
        except trio.WouldBlock:
            raise SendQueueFull(
                executor_id=executor_id, capacity=self.config.send_queue_frames
            ) from None
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            raise ExecutorUnavailable(executor_id=executor_id, state=executor.state.value) from None

    def replace(self, executor_id: str, why: str) -> None:
        executor = self._executors.get(executor_id)
        incarnation = None if executor is None else executor.incarnation
        if executor is None or incarnation is None or incarnation.down_reason is not None:
            return
        incarnation.going_down(DownReason.WEDGED)
        executor.state = ExecutorState.WEDGED
        logger.warning(
            "executor %s (pid %d) did not stop a cancelled call: %s; killing it",
            executor_id,
            incarnation.process.pid,
            why,
        )
        incarnation.process.kill()

    def snapshot(self) -> tuple[ExecutorView, ...]:
        return tuple(
            ExecutorView(
                executor_id=e.executor_id,
                state=e.state,
                pid=e.pid,
                rss_bytes=e.rss_bytes,
                calls_served=e.calls_served,
                restarts=e.restarts,
                running_call_id=e.running_call_id,
            )
            for e in self._executors.values()
        )

    # --- lifecycle --------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until `stop()` or cancellation; started() once the socket listens
        and the first processes are spawning. Runs once per manager."""
        if self._started:
            raise Misuse(what="a pool manager runs once; make a new one")
        self._started = True
        listener: trio.SocketListener | None = None
        try:
            self.runtime_dir = tempfile.mkdtemp(
                prefix="blockx-", dir=self.config.runtime_dir_parent
            )
            add_private_dir(self.runtime_dir)
            self._socket_path = os.path.join(self.runtime_dir, SOCKET_NAME)
            if len(os.fsencode(self._socket_path)) > _MAX_SOCKET_PATH_BYTES:
                raise RuntimeDirError(
                    path=self._socket_path,
                    reason=f"a Unix socket path has at most {_MAX_SOCKET_PATH_BYTES} bytes; "
                    "set runtime_dir_parent to a shorter directory",
                )
            listener = await self._listen()
            with self._run_scope:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._accept_loop, listener, nursery)
                    nursery.start_soon(self._health_loop)
                    for executor in self._executors.values():
                        nursery.start_soon(self._supervise, executor)
                    task_status.started()
        finally:
            with trio.CancelScope(shield=True):
                if listener is not None:
                    await listener.aclose()
                if self.runtime_dir is not None:
                    shutil.rmtree(self.runtime_dir, ignore_errors=True)
                    discard_private_dir(self.runtime_dir)
            for executor in self._executors.values():
                executor.state = ExecutorState.STOPPED
            self._finished.set()

    async def stop(self) -> None:
        """Send Shutdown to every executor, wait up to `grace_ms` for them to
        exit, then kill the rest; returns when every process is reaped and the
        runtime directory is gone."""
        if not self._started:
            return
        if not self._stop_requested.is_set():
            self._stop_requested.set()
            shutdown = encode_frame(Shutdown())
            for executor in self._executors.values():
                incarnation = executor.incarnation
                if incarnation is None:
                    continue
                try:
                    incarnation.queue(shutdown)
                except (trio.WouldBlock, trio.ClosedResourceError, trio.BrokenResourceError):
                    incarnation.process.kill()  # full or not connected: nothing to finish
            with trio.move_on_after(self.config.grace_ms / 1000):
                for executor in self._executors.values():
                    if executor.incarnation is not None:
                        await executor.incarnation.exited.wait()
            self._run_scope.cancel()
        await self._finished.wait()

    # --- tasks --------------------------------------------------------------------------------

    async def _listen(self) -> trio.SocketListener:
        sock = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
        try:
            await sock.bind(self._socket_path)
            sock.listen(max(16, 2 * self.config.executor_count))
        except OSError as exc:
            sock.close()
            raise RuntimeDirError(path=self._socket_path, reason=str(exc)) from exc
        return trio.SocketListener(sock)

    async def _accept_loop(self, listener: trio.SocketListener, nursery: trio.Nursery) -> None:
        while True:
            stream = await listener.accept()
            nursery.start_soon(self._handshake, stream)

    async def _handshake(self, stream: trio.SocketStream) -> None:
        """Authenticate a new connection and hand it to its incarnation, or close it."""
        decoder = FrameDecoder(max_frame_bytes=_HELLO_MAX_FRAME_BYTES)
        handed_over = False
        try:
            hello: object = _NO_HELLO_IN_TIME
            with trio.move_on_after(self.config.start_timeout_ms / 1000):
                hello = await self._read_first(stream, decoder)
            incarnation, refusal = self._authenticate(hello)
            if incarnation is None:
                logger.warning("executor connection refused: %s", refusal)
                return
            decoder.max_frame_bytes = MAX_FRAME_BYTES
            incarnation.stream = stream
            incarnation.decoder = decoder
            incarnation.connected.set()
            handed_over = True
        finally:
            if not handed_over:
                with trio.CancelScope(shield=True):
                    await stream.aclose()

    async def _read_first(self, stream: trio.SocketStream, decoder: FrameDecoder) -> object:
        """The first message on `stream`, a WireError, or `_CLOSED_FIRST` at end of file."""
        try:
            while True:
                for message in decoder:
                    return message
                data = await stream.receive_some(4096)
                if not data:
                    return _CLOSED_FIRST
                decoder.feed(data)
        except WireError as exc:
            return exc
        except trio.BrokenResourceError:
            return _CLOSED_FIRST

    def _authenticate(self, hello: object) -> tuple[_Incarnation | None, str]:
        if hello is _NO_HELLO_IN_TIME:
            return None, f"no Hello within {self.config.start_timeout_ms} ms"
        if hello is _CLOSED_FIRST:
            return None, "closed before sending a Hello"
        if isinstance(hello, WireError):  # (the frame is at most 64 KiB: say less of it)
            return None, f"its first frame is malformed: {str(hello)[:_REASON_CHARS]}"
        if not isinstance(hello, Hello):
            return None, f"its first message was a {type(hello).__name__}, not a Hello"
        executor = self._executors.get(hello.executor_id)
        who = f"executor_id={shown(hello.executor_id)} pid={hello.pid}"
        if hello.protocol_version != PROTOCOL_VERSION:
            return None, (
                f"{who} speaks protocol {hello.protocol_version}, this worker {PROTOCOL_VERSION}"
            )
        if executor is None:
            return None, f"{who}: no such executor"
        incarnation = executor.incarnation
        if incarnation is None:
            return None, f"{who}: no process is running for it"
        if not secrets.compare_digest(hello.token, incarnation.token):
            return None, f"{who}: wrong token"
        if incarnation.connected.is_set() or incarnation.down_reason is not None:
            return None, f"{who}: already connected, or going down"
        if hello.pid != incarnation.process.pid:
            return None, f"{who}: the process started is pid {incarnation.process.pid}"
        return incarnation, ""

    async def _supervise(self, executor: _Executor) -> None:
        """One executor id for the pool's lifetime: incarnations and the restarts between."""
        await self._run_incarnation(executor)
        while not self._stop_requested.is_set() and self.config.restart_enabled:
            now_ms = self._now_ms()
            recent = executor.window.recent(now_ms)
            delay_ms = executor.window.next_delay_ms(now_ms)
            executor.state = ExecutorState.RESTARTING
            if recent >= self.config.max_restarts:
                logger.warning(
                    "executor %s restarted %d times within %d ms; backing off %d ms",
                    executor.executor_id,
                    recent,
                    self.config.restart_window_ms,
                    delay_ms,
                )
            await trio.sleep(delay_ms / 1000)
            if self._stop_requested.is_set():
                break
            executor.window.record(self._now_ms())
            executor.restarts += 1
            await self._run_incarnation(executor)

    async def _run_incarnation(self, executor: _Executor) -> None:
        if self._stop_requested.is_set():
            return
        incarnation = await self._spawn(executor)
        if incarnation is None:
            return
        try:
            with incarnation.cancel_scope:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._watch_exit, incarnation)
                    nursery.start_soon(self._session, executor, incarnation)
        finally:
            await self._reap(executor, incarnation)
        self._report_down(executor, incarnation)

    async def _spawn(self, executor: _Executor) -> _Incarnation | None:
        token = secrets.token_hex(32)
        env = {**os.environ, TOKEN_ENV: token}
        command = [
            self.config.python_executable,
            "-m",
            CHILD_MODULE,
            "--socket",
            self._socket_path,
            "--executor-id",
            executor.executor_id,
        ]
        try:
            process = await trio.lowlevel.open_process(command, env=env, stdin=subprocess.DEVNULL)
        except OSError as exc:
            logger.error("executor %s could not be started: %s", executor.executor_id, exc)
            executor.state = ExecutorState.EXITED
            return None
        incarnation = _Incarnation(process=process, token=token)
        executor.incarnation = incarnation
        executor.pid = process.pid
        executor.state = ExecutorState.STARTING
        executor.running_call_id = None
        executor.rss_bytes = 0
        return incarnation

    async def _reap(self, executor: _Executor, incarnation: _Incarnation) -> None:
        """Kill the process if it still runs and wait for it, whatever ended the incarnation."""
        incarnation.going_down(DownReason.EXITED)  # refuses late connections from now on
        process = incarnation.process
        with trio.CancelScope(shield=True):
            if process.returncode is None:
                if self._stop_requested.is_set():
                    logger.warning(
                        "executor %s (pid %d) still running at the stop deadline; killing",
                        executor.executor_id,
                        process.pid,
                    )
                process.kill()
            await process.wait()
            if incarnation.stream is not None:
                await incarnation.stream.aclose()
        if incarnation.frames is not None:
            incarnation.frames.close()
        executor.incarnation = None
        executor.pid = None
        incarnation.exited.set()

    def _report_down(self, executor: _Executor, incarnation: _Incarnation) -> None:
        reason = incarnation.down_reason or DownReason.EXITED
        running_call_id, executor.running_call_id = executor.running_call_id, None
        if self._stop_requested.is_set():
            executor.state = ExecutorState.STOPPED
            return
        executor.state = _STATE_OF_REASON[reason]
        process = incarnation.process
        logger.warning(
            "executor %s (pid %d) is down: %s, exit status %s",
            executor.executor_id,
            process.pid,
            reason.value,
            process.returncode,
        )
        if incarnation.up:
            self._forward(
                ExecutorDown(
                    executor_id=executor.executor_id,
                    pid=process.pid,
                    reason=reason,
                    running_call_id=running_call_id,
                )
            )

    async def _watch_exit(self, incarnation: _Incarnation) -> None:
        await incarnation.process.wait()
        incarnation.going_down(DownReason.EXITED)
        incarnation.cancel_scope.cancel()

    async def _session(self, executor: _Executor, incarnation: _Incarnation) -> None:
        with trio.move_on_after(self.config.start_timeout_ms / 1000):
            await incarnation.connected.wait()
        if incarnation.stream is None or incarnation.decoder is None:
            logger.warning(
                "executor %s (pid %d) did not connect within %d ms",
                executor.executor_id,
                incarnation.process.pid,
                self.config.start_timeout_ms,
            )
            incarnation.going_down(DownReason.LOST)
            incarnation.cancel_scope.cancel()
            return
        frames, outgoing = trio.open_memory_channel[bytes](self.config.send_queue_frames)
        incarnation.frames = frames
        incarnation.queue(
            encode_frame(
                Welcome(
                    heartbeat_interval_ms=self.config.heartbeat_interval_ms,
                    max_result_bytes=self.config.max_result_bytes,
                )
            )
        )
        incarnation.last_heartbeat_at_ms = self._now_ms()
        incarnation.up = True
        executor.state = ExecutorState.READY
        self._first_healthy.set()
        logger.info("executor %s ready (pid %d)", executor.executor_id, incarnation.process.pid)
        up = ExecutorUp(executor_id=executor.executor_id, pid=incarnation.process.pid)
        self._forward(up)
        stream = incarnation.stream
        incarnation.direct = socket.socket(fileno=os.dup(stream.socket.fileno()))
        incarnation.direct.setblocking(False)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._write_loop, incarnation, outgoing)
                clean_end = await self._read_loop(executor, incarnation, stream)
                nursery.cancel_scope.cancel()
        finally:
            direct, incarnation.direct = incarnation.direct, None
            direct.close()
        if clean_end:
            # End of file: the process is on its way out (Shutdown, or it failed).
            # If it lingers without a connection it is of no use: kill it.
            await trio.sleep(_EXIT_AFTER_EOF_S)
            incarnation.going_down(DownReason.LOST)
        incarnation.cancel_scope.cancel()

    async def _read_loop(
        self, executor: _Executor, incarnation: _Incarnation, stream: trio.SocketStream
    ) -> bool:
        """Forward messages until end of file (True) or a protocol error (False)."""
        decoder = incarnation.decoder
        assert decoder is not None
        try:
            while True:
                for message in decoder:
                    self._on_message(executor, incarnation, message)
                data = await stream.receive_some(RECV_BYTES)
                if not data:
                    return True
                decoder.feed(data)
        except trio.BrokenResourceError:
            return True
        except WireError as exc:
            logger.warning(
                "executor %s (pid %d) broke the protocol; killing it: %s",
                executor.executor_id,
                incarnation.process.pid,
                exc,
            )
            incarnation.going_down(DownReason.LOST)
            return False

    def _on_message(self, executor: _Executor, incarnation: _Incarnation, message: object) -> None:
        match message:
            case Heartbeat():
                incarnation.heartbeat = message
                incarnation.last_heartbeat_at_ms = self._now_ms()
                executor.rss_bytes = message.rss_bytes
                executor.running_call_id = message.running_call_id
                if executor.state in (ExecutorState.READY, ExecutorState.BUSY):
                    busy = message.running_call_id is not None
                    executor.state = ExecutorState.BUSY if busy else ExecutorState.READY
            case CallResults(results=results, succeeded=succeeded):
                executor.calls_served += len(results) + len(succeeded)
                # Taken off here, before the results go on: the task they end must never
                # be seen ended while its call still shows running (the next heartbeat
                # would tell only up to an interval later). An executor sends a call's
                # results after every heartbeat that names it (see the child).
                running = executor.running_call_id
                if running is not None and (
                    any(result.call_id == running for result in results)
                    or any(row[0] == running for row in succeeded)
                ):
                    executor.running_call_id = None
                    if executor.state is ExecutorState.BUSY:
                        executor.state = ExecutorState.READY
            case CodeRequest() | Subcall():
                pass
            case _:
                raise ProtocolViolation(
                    executor_id=executor.executor_id,
                    message_type=type(message).__name__,
                    expected="Heartbeat, CallResults, CodeRequest or Subcall",
                )
        self._forward(ExecutorMessage(executor_id=executor.executor_id, message=message))

    def _forward(self, event: PoolEvent) -> None:
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            self._events.send_nowait(event)  # nobody listens any more: nothing to tell

    async def _write_loop(
        self, incarnation: _Incarnation, outgoing: trio.MemoryReceiveChannel[bytes]
    ) -> None:
        stream = incarnation.stream
        assert stream is not None
        async for first in outgoing:
            batch = [first]
            size = len(first)
            while size < _WRITE_BATCH_BYTES:
                try:
                    frame = outgoing.receive_nowait()
                except (trio.WouldBlock, trio.EndOfChannel):
                    break
                batch.append(frame)
                size += len(frame)
            try:
                await stream.send_all(first if len(batch) == 1 else b"".join(batch))
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return  # the reader sees the end of the connection
            incarnation.unsent -= len(batch)

    async def _health_loop(self) -> None:
        config = self.config
        while True:
            await trio.sleep(config.health_check_interval_ms / 1000)
            now_ms = self._now_ms()
            for executor in self._executors.values():
                incarnation = executor.incarnation
                if incarnation is None or not incarnation.up or incarnation.down_reason is not None:
                    continue
                verdict = assess_health(
                    now_ms=now_ms,
                    last_heartbeat_at_ms=incarnation.last_heartbeat_at_ms,
                    heartbeat=incarnation.heartbeat,
                    heartbeat_timeout_ms=config.heartbeat_timeout_ms,
                    stall_timeout_ms=config.stall_timeout_ms,
                )
                if verdict is None:
                    continue
                incarnation.going_down(verdict)
                executor.state = _STATE_OF_REASON[verdict]
                logger.warning(
                    "executor %s (pid %d) is %s (running call %r); killing it",
                    executor.executor_id,
                    incarnation.process.pid,
                    verdict.value,
                    executor.running_call_id,
                )
                incarnation.process.kill()

    def _now_ms(self) -> int:
        return self._clock.now_ms()
