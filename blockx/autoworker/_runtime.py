"""The automatic worker on Trio: connections, handlers and their leases, the drain.

`Worker.run` drives a `WorkerCore` (the rules) with what happens: it keeps a
WebSocket to the hub (reconnecting with back-off and jitter), feeds each
message to the core, runs each handler the core starts in a cancel scope whose
deadline is the attempt's lease (the lease monitor: it fires on local time,
whatever the network does), and sends what the core says to send, batching
one step's messages into one frame.

Cancelling the scope around `run` starts the drain: no new attempts, the
running ones renewed and their results confirmed, then `run` returns. If that
takes longer than the shutdown timeout, the handlers and control requests are
cancelled and `run` raises `WorkerRunError` with what was left.
"""

from __future__ import annotations

import contextlib
import logging
import math
import random
import secrets
from typing import Any, Final

import attrs
import trio
import trio_websocket

from blockx.autoworker import _handlers
from blockx.autoworker._client import HubClient
from blockx.autoworker._core import (
    CancelHandler,
    Command,
    Connected,
    Disconnected,
    DrainRequested,
    Event,
    HandlerReturned,
    Notice,
    Received,
    RunHandler,
    Send,
    SetLease,
    TimePassed,
    WorkerCore,
)
from blockx.autoworker._handlers import WorkerExecution, WorkerOptions
from blockx.errors import BlockxError
from blockx.hubwire import (
    MAX_FRAME_BYTES,
    PROTOCOL_VERSION,
    WORKER_PATH,
    Error,
    ErrorCode,
    Failed,
    Hello,
    Offer,
    Outcome,
    ProtocolError,
    ToHub,
    Welcome,
    decode,
    encode,
)
from blockx.process.clock import EpochClock
from blockx.steps import StimulusIds

logger = logging.getLogger(__name__)

EVENTS_BUFFER: Final = 128
HANDSHAKE_TIMEOUT_S: Final = 10.0
RECEIVE_BUFFER_BYTES: Final = 64 * 1024
FATAL: Final = frozenset(
    {
        ErrorCode.AUTH_FAILED,
        ErrorCode.PERMISSION_DENIED,
        ErrorCode.VERSION_MISMATCH,
        ErrorCode.PROTOCOL_ERROR,
        ErrorCode.MESSAGE_ID_REUSED,
    }
)
"""What ends `run`: retrying cannot help. Other errors are reconnected after."""


class WorkerAlreadyRun(BlockxError):
    """`run` was called a second time on the same `Worker`."""

    def __init__(self) -> None:
        super().__init__("Worker.run may be called once per Worker; make a new Worker")


class WorkerRunError(BlockxError):
    """`run` ended before everything was confirmed: why, and what was left.

    `unconfirmed` results were sent but not acknowledged; `running` handlers had not
    returned (a handler that ignores cancellation may still be running).
    """

    def __init__(self, reason: str, *, unconfirmed: int, running: int, code: str = "") -> None:
        self.reason = reason
        self.code = code
        self.unconfirmed = unconfirmed
        self.running = running
        super().__init__(f"{reason} (unconfirmed results: {unconfirmed}, running: {running})")


class WorkerShutdownTimeout(WorkerRunError):
    """The drain did not finish within the shutdown timeout."""


@attrs.frozen(kw_only=True)
class WorkerStats:
    """Counts of this process's worker since `run` began (not business success rates).
    `reports_confirmed` counts every confirmed report, failed and unknown ones included,
    so a task that was retried may count more than once."""

    running: int
    started: int
    renewals_confirmed: int
    reports_confirmed: int
    evidence_confirmed: int
    reconnects: int
    dropped_events: int


@attrs.frozen(kw_only=True)
class WorkerEvent:
    """A local notice: its type, the task and attempt, and a stable class, never results
    or secrets. Types: started, returned, confirmed, lease_lost, start_refused,
    report_refused, offer_ignored, disconnected, reconnected, draining,
    drain_acknowledged."""

    type: str
    task_id: str = ""
    attempt_id: str = ""
    detail: str = ""


class _Fatal(Exception):
    def __init__(self, error: Error) -> None:
        self.error = error
        super().__init__(f"{error.code.value}: {error.message}")


class Worker:
    """Runs `options.handlers` on tasks the hub at `client` offers; see the module docstring."""

    def __init__(
        self,
        client: HubClient,
        options: WorkerOptions,
        *,
        clock: EpochClock | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self._client = client
        self._options = options
        self._clock = clock
        self._rng = rng or random.Random()
        self._stimuli = StimulusIds()
        self.instance_id = secrets.token_hex(16)
        self._core = WorkerCore(
            instance_id=self.instance_id,
            queue_id=options.queue_id,
            capabilities=tuple(handler.capability for handler in options.handlers),
            capacity=options.capacity,
        )
        self._ran = False
        self._events_in, self._events_out = trio.open_memory_channel[WorkerEvent](EVENTS_BUFFER)
        self._dropped = 0
        self._outbox: list[ToHub] = []
        self._outbox_ready = trio.Event()
        self._scopes: dict[str, trio.CancelScope] = {}
        self._timer = trio.CancelScope()
        self._changed = trio.Event()
        self._nursery: trio.Nursery | None = None
        self._sockets: trio.Nursery | None = None

    # ------------------------------------------------------------------ what callers read

    def stats(self) -> WorkerStats:
        counters = self._core.counters
        return WorkerStats(
            running=self._core.running,
            started=counters.started,
            renewals_confirmed=counters.renewals_confirmed,
            reports_confirmed=counters.reports_confirmed,
            evidence_confirmed=counters.evidence_confirmed,
            reconnects=counters.reconnects,
            dropped_events=self._dropped,
        )

    def events(self) -> trio.MemoryReceiveChannel[WorkerEvent]:
        """The notices, 128 buffered; when nobody reads, new ones are dropped and counted.
        The channel closes when `run` returns."""
        return self._events_out

    # ------------------------------------------------------------------ run

    async def run(self) -> None:
        """Work until the surrounding scope is cancelled, then drain and return (as
        Trio does: the cancellation goes on to the scope). `WorkerRunError` if the hub
        ended the session for good, `WorkerShutdownTimeout` if the drain overran."""
        if self._ran:
            raise WorkerAlreadyRun()
        self._ran = True
        self._clock = self._clock or EpochClock()
        finished = trio.Event()
        failure: list[WorkerRunError] = []
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._live, finished, failure)
                try:
                    await finished.wait()
                except trio.Cancelled:
                    with trio.CancelScope(shield=True):
                        await self._drain(finished, failure)
                    raise
        finally:
            self._events_in.close()
            if failure:
                raise failure[0]  # it ends the run, whatever else was going on

    async def _drain(self, finished: trio.Event, failure: list[WorkerRunError]) -> None:
        now_ms, stimulus_id = self._stamp("drain")
        self._apply(DrainRequested(now_ms=now_ms, stimulus_id=stimulus_id))
        with trio.move_on_after(self._options.shutdown_timeout_ms / 1000):
            await finished.wait()
            return
        unconfirmed, running = self._core.unconfirmed, self._core.running
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()
        await finished.wait()
        failure.append(
            WorkerShutdownTimeout(
                f"the drain did not finish within {self._options.shutdown_timeout_ms} ms",
                unconfirmed=unconfirmed,
                running=running,
            )
        )

    async def _live(self, finished: trio.Event, failure: list[WorkerRunError]) -> None:
        """Everything the worker does, shielded: only the drain or its timeout ends it."""
        try:
            with trio.CancelScope(shield=True):
                # The sockets' own tasks outlive the work, so a connection cancelled by the
                # shutdown timeout still closes at once.
                async with trio.open_nursery() as sockets:
                    self._sockets = sockets
                    async with trio.open_nursery() as nursery:
                        self._nursery = nursery
                        nursery.start_soon(self._tick)
                        error = await self._connections()
                        if error is not None:
                            failure.append(error)
                        nursery.cancel_scope.cancel()
                    sockets.cancel_scope.cancel()
        finally:
            finished.set()

    def _now(self) -> int:
        assert self._clock is not None
        return self._clock.now_ms()

    # ------------------------------------------------------------------ the core's steps

    def _stamp(self, kind: str) -> tuple[int, str]:
        """The time and the stimulus id of an event: the one place they are given."""
        return self._now(), self._stimuli.stamp(kind)

    def _apply(self, event: Event) -> None:
        for command in self._core.handle(event).commands:
            self._execute(command)
        deadline = self._core.next_deadline_ms()
        assert self._clock is not None
        self._timer.deadline = math.inf if deadline is None else self._clock.trio_time(deadline)
        self._changed.set()

    def _execute(self, command: Command) -> None:
        match command:
            case Send(messages=messages):
                self._outbox.extend(messages)
                self._outbox_ready.set()
            case RunHandler(offer=offer, lease_deadline_ms=deadline_ms):
                assert self._nursery is not None
                assert self._clock is not None
                scope = trio.CancelScope(deadline=self._clock.trio_time(deadline_ms))
                self._scopes[offer.attempt_id] = scope
                self._nursery.start_soon(self._run_handler, offer, scope)
            case SetLease(attempt_id=attempt_id, lease_deadline_ms=deadline_ms):
                lease = self._scopes.get(attempt_id)
                if lease is not None and self._clock is not None:
                    lease.deadline = self._clock.trio_time(deadline_ms)
            case CancelHandler(attempt_id=attempt_id):
                lease = self._scopes.get(attempt_id)
                if lease is not None:
                    lease.cancel()
            case Notice():
                self._notify(command)

    def _notify(self, notice: Notice) -> None:
        event = WorkerEvent(
            type=notice.type,
            task_id=notice.task_id,
            attempt_id=notice.attempt_id,
            detail=notice.detail,
        )
        try:
            self._events_in.send_nowait(event)
        except (trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
            self._dropped += 1

    async def _tick(self) -> None:
        """Tells the core when time passed one of its deadlines."""
        while True:
            deadline = self._core.next_deadline_ms()
            assert self._clock is not None
            self._timer = trio.CancelScope(
                deadline=math.inf if deadline is None else self._clock.trio_time(deadline)
            )
            with self._timer:
                await trio.sleep_forever()
            now_ms, stimulus_id = self._stamp("tick")
            self._apply(TimePassed(now_ms=now_ms, stimulus_id=stimulus_id))

    # ------------------------------------------------------------------ handlers

    async def _run_handler(self, offer: Offer, lease: trio.CancelScope) -> None:
        try:
            outcome = await self._outcome_of(offer, lease)
        finally:
            self._scopes.pop(offer.attempt_id, None)
        now_ms, stimulus_id = self._stamp("returned")
        self._apply(
            HandlerReturned(
                now_ms=now_ms, stimulus_id=stimulus_id, attempt_id=offer.attempt_id, outcome=outcome
            )
        )

    async def _outcome_of(self, offer: Offer, lease: trio.CancelScope) -> Outcome:
        handler = self._options.handler_for(offer.capability)
        assert handler is not None  # the core keeps only offers of declared capabilities
        try:
            payload = handler.payload_of(offer.payload)
        except ValueError:
            return Failed(code="INVALID_PAYLOAD", details='{"reason":"payload is not JSON"}')
        execution = WorkerExecution(
            task_id=offer.task_id,
            attempt_id=offer.attempt_id,
            epoch=offer.epoch,
            capability=offer.capability,
            payload=payload,
            payload_text=offer.payload,
            attempt_deadline_ms=min(offer.task_deadline_ms, self._now() + offer.attempt_timeout_ms),
        )
        value: Any = None
        error: BaseException | None = None
        with lease:
            try:
                value = await handler.handle(execution)
            except (trio.Cancelled, KeyboardInterrupt):
                raise
            except BaseException as raised:  # the handler's failure is the report
                error = raised
        if lease.cancelled_caught:
            return _handlers.lease_lost()
        if error is not None:
            return _handlers.raised(error)
        return _handlers.returned(value)

    # ------------------------------------------------------------------ connections

    async def _connections(self) -> WorkerRunError | None:
        """Connect, serve, and after a transient loss reconnect with back-off, until
        drained; what a fatal error from the hub ended the run with."""
        options = self._options
        delay_ms = options.reconnect_min_delay_ms
        while not self._core.drained():
            try:
                stream, socket = await self._connect()
                delay_ms = options.reconnect_min_delay_ms
                try:
                    await self._serve(socket)
                finally:
                    with trio.CancelScope(shield=True), trio.move_on_after(1):
                        await socket.aclose()
                    # trio-websocket leaves the stream open when the hub went away first.
                    await trio.aclose_forcefully(stream)
            except _Fatal as fatal:
                return WorkerRunError(
                    f"the hub ended the worker's session: {fatal}",
                    code=fatal.error.code.value,
                    unconfirmed=self._core.unconfirmed,
                    running=self._core.running,
                )
            except _TRANSIENT as error:
                logger.info("hub connection lost: %s", error or type(error).__name__)
            if self._core.drained():
                break
            sleep_ms = self._rng.uniform(options.reconnect_min_delay_ms, delay_ms)
            delay_ms = min(options.reconnect_max_delay_ms, delay_ms * 2)
            await trio.sleep(sleep_ms / 1000)
        return None

    async def _connect(self) -> tuple[trio.abc.Stream, trio_websocket.WebSocketConnection]:
        """A WebSocket whose hello was welcomed, and the stream it runs on."""
        with trio.fail_after(HANDSHAKE_TIMEOUT_S):
            stream = _Watched(await self._client.open_stream())
            try:
                socket = await self._open_websocket(stream)
            except BaseException:
                await trio.aclose_forcefully(stream)
                raise
            try:
                hello = Hello(protocol_version=PROTOCOL_VERSION, credential=self._client.credential)
                await socket.send_message(encode([hello]))
                [welcome] = decode(await socket.get_message())
                if isinstance(welcome, Error):
                    _raise_error(welcome)
                if not isinstance(welcome, Welcome):
                    raise ProtocolError(reason=f"expected welcome, got {type(welcome).__name__}")
            except BaseException:
                with trio.CancelScope(shield=True), trio.move_on_after(1):
                    await socket.aclose()
                await trio.aclose_forcefully(stream)
                raise
        return stream, socket

    async def _open_websocket(self, stream: _Watched) -> trio_websocket.WebSocketConnection:
        """The WebSocket's opening handshake on `stream`; `trio.BrokenResourceError` if the
        connection ends first (trio-websocket would wait for the handshake regardless)."""
        assert self._sockets is not None
        nursery = self._sockets
        ended: list[trio_websocket.WebSocketConnection | Exception] = []
        async with trio.open_nursery() as race:

            async def handshake() -> None:
                try:
                    socket = await trio_websocket.wrap_client_stream(
                        nursery,
                        stream,  # type: ignore[arg-type]  # any Stream serves; annotated narrower
                        self._client.host,
                        WORKER_PATH,
                        max_message_size=MAX_FRAME_BYTES,
                        receive_buffer_size=RECEIVE_BUFFER_BYTES,
                    )
                except Exception as error:  # raised below, not as a group of one
                    ended.append(error)
                else:
                    ended.append(socket)
                race.cancel_scope.cancel()

            race.start_soon(handshake)
            await stream.ended.wait()
            race.cancel_scope.cancel()
        if not ended:
            raise trio.BrokenResourceError("the connection ended during the WebSocket handshake")
        if isinstance(ended[0], Exception):
            raise ended[0]
        return ended[0]

    async def _serve(self, socket: trio_websocket.WebSocketConnection) -> None:
        """One connection's life: what comes in goes to the core, what the core says
        goes out. Ends with the exception that ended the connection, if any."""
        self._outbox.clear()
        now_ms, stimulus_id = self._stamp("connected")
        self._apply(Connected(now_ms=now_ms, stimulus_id=stimulus_id))
        ended: list[Exception] = []
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._write, socket)
                try:
                    await self._read(socket)
                except (_Fatal, *_TRANSIENT) as error:
                    ended.append(error)
                nursery.cancel_scope.cancel()
        finally:
            now_ms, stimulus_id = self._stamp("disconnected")
            self._apply(Disconnected(now_ms=now_ms, stimulus_id=stimulus_id))
            self._outbox.clear()
        if ended:
            raise ended[0]

    async def _read(self, socket: trio_websocket.WebSocketConnection) -> None:
        """Hands each message to the core. The hub answers every heartbeat, so nothing
        heard for a session TTL means a dead line (one that black-holes traffic never
        errors): it is given up and a new one made."""
        while not self._core.drained():
            silence_ms = self._core.session_ttl_ms or HANDSHAKE_TIMEOUT_S * 1000
            frame: bytes | str = b""
            with trio.move_on_after(silence_ms / 1000) as waiting:
                frame = await socket.get_message()
            if waiting.cancelled_caught:
                raise _Closed(f"nothing from the hub for {silence_ms} ms")
            for message in decode(frame):
                if isinstance(message, Error):
                    _raise_error(message)
                if isinstance(message, Welcome | Hello):
                    raise ProtocolError(reason=f"unexpected {type(message).__name__}")
                now_ms, stimulus_id = self._stamp("received")
                self._apply(
                    Received(now_ms=now_ms, stimulus_id=stimulus_id, message=message)  # type: ignore[arg-type]
                )

    async def _write(self, socket: trio_websocket.WebSocketConnection) -> None:
        """Sends what the outbox holds, all of it in one frame each time."""
        with contextlib.suppress(trio_websocket.ConnectionClosed, trio.BrokenResourceError):
            while True:
                await self._outbox_ready.wait()
                self._outbox_ready = trio.Event()
                messages, self._outbox = self._outbox, []
                if messages:
                    await socket.send_message(encode(messages))


class _Closed(Exception):
    """The hub closed the connection with an error worth reconnecting after."""


@attrs.define(eq=False)
class _Watched(trio.abc.Stream):
    """A connection's stream that tells when it ended (closed, reset, or at its end)."""

    inner: trio.abc.Stream
    ended: trio.Event = attrs.Factory(trio.Event)

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        try:
            await self.inner.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self.ended.set()
            raise

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        try:
            data = await self.inner.receive_some(max_bytes)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self.ended.set()
            raise
        if not data:
            self.ended.set()
        return data

    async def aclose(self) -> None:
        self.ended.set()
        await self.inner.aclose()


_TRANSIENT: Final = (
    OSError,
    trio.BrokenResourceError,
    trio.TooSlowError,
    trio_websocket.HandshakeError,
    trio_websocket.ConnectionClosed,
    ProtocolError,
    _Closed,
)


def _raise_error(error: Error) -> None:
    if error.code in FATAL:
        raise _Fatal(error)
    raise _Closed(f"{error.code.value}: {error.message}")
