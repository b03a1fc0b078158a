"""The automatic worker on Trio: connections, handlers and their leases, the drain.

`Worker.run` drives a `WorkerCore` (the rules) with what happens: it keeps a
WebSocket to the hub (reconnecting with back-off and jitter after a transient
failure; one that retrying cannot heal ends `run`, as `_classify` judges), feeds
each message to the core, runs each handler the core starts, and sends what the
core says to send, batching one step's messages into one frame.

Handlers. An async handler runs on the Trio thread in a cancel scope whose
deadline is the attempt's lease (the lease monitor: it fires on local time,
whatever the network does). A plain one runs in a worker thread (at most
`capacity` at once, by the worker's own limiter), so that blocking code never
holds up heartbeats, renewals and the lease monitors; Python cannot interrupt
a thread, so it is told of its cancellation through `WorkerExecution`, and the
runtime waits for it to return (its slot stays held) like for an async handler
that ignores cancellation.

Cancelling the scope around `run` starts the drain: no new attempts, the
running ones renewed and their results confirmed, then `run` returns. If that
takes longer than the shutdown timeout, the handlers and the connection are
cancelled and `run` raises `WorkerShutdownTimeout` with what was left, at most
about a second later: the handlers get `EXIT_GRACE_S` to end, the connection's
closing handshake at most a second. A handler still running then is abandoned.
So that it can be, each handler runs as a Trio system task (a task of no
nursery of `run`'s) that the worker tracks itself, and a thread is awaited
with `abandon_on_cancel`, which only the end of `trio.run` uses. A system task
must never raise (that would crash `trio.run`): what a handler's task catches
goes to `run`, which raises it. System tasks are shielded from
KeyboardInterrupt, which Trio hands to the main task instead. Trio waits for
system tasks at the end of `trio.run`, and no thread can be killed: a process
whose `run` left handlers running should exit.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import math
import random
import secrets
import ssl
import threading
from typing import Any, Final

import attrs
import h11
import trio
import trio_websocket

from blockx.autoworker import _handlers
from blockx.autoworker._client import HubCertificateRejected, HubClient
from blockx.autoworker._core import (
    CancelHandler,
    CapacityChanged,
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
EXIT_GRACE_S: Final = 0.5
"""How long `run`, giving up, waits for the handlers it cancelled before abandoning them."""
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
"""The hub's errors that end `run`: retrying cannot help. Other errors are reconnected after."""
WARN_EVERY_S: Final = 30.0
"""A failure to connect is logged as a warning at most this often (Trio clock); else at INFO."""
AT_ONCE: Final = 1
IN_A_ROW: Final = 3
"""A failure that a one-off garble could cause (an answer that is not the protocol) ends
`run` once it happened this many times in a row."""
HEAD_BYTES: Final = 16 * 1024
MAX_CAUSES: Final = 16


class WorkerAlreadyRun(BlockxError):
    """`run` was called a second time on the same `Worker`."""

    def __init__(self) -> None:
        super().__init__("Worker.run may be called once per Worker; make a new Worker")


class WorkerRunError(BlockxError):
    """`run` ended before everything was confirmed: why, and what was left.

    `reason` names the hub's URL and what failed; `code` classifies a failure to reach
    the hub that retrying cannot heal: the hub's error code (`AUTH_FAILED`,
    `PERMISSION_DENIED`, ...), `UPGRADE_REFUSED` (the WebSocket upgrade was answered with
    an HTTP status), `NOT_A_HUB` (an answer that is not the protocol), `TLS_CERTIFICATE`,
    `TLS_FAILED`, `PROTOCOL_ERROR` (a frame the protocol does not allow) or `UNEXPECTED`;
    it is empty when the drain overran. `unconfirmed` results were sent but not
    acknowledged; `running` handlers had not returned, `attempts` their attempt ids.
    They were cancelled; one that did not end within `EXIT_GRACE_S` was abandoned and
    may still be running (see the module).
    """

    def __init__(
        self,
        reason: str,
        *,
        unconfirmed: int,
        running: int,
        attempts: tuple[str, ...],
        code: str = "",
    ) -> None:
        self.reason = reason
        self.code = code
        self.unconfirmed = unconfirmed
        self.running = running
        self.attempts = attempts
        named = f", attempts: {', '.join(attempts)}" if attempts else ""
        super().__init__(
            f"{reason} (unconfirmed results: {unconfirmed}, running: {running}{named})"
        )


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
    connected: bool
    """A WebSocket to the hub is up (its hello was welcomed)."""
    last_error: str
    """Why the last connection failed or ended, kept after a reconnect; "" if none did."""


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


@attrs.define(eq=False)
class _Handling:
    """One handler under way: the scope an async one runs in (its deadline is the lease)
    and the signal a plain one reads; `cancel` trips both."""

    offer: Offer
    scope: trio.CancelScope
    signal: threading.Event = attrs.Factory(threading.Event)
    ended: trio.Event = attrs.Factory(trio.Event)

    def cancel(self) -> None:
        self.signal.set()
        self.scope.cancel()


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
        self._handlers: dict[str, _Handling] = {}
        self._threads = trio.CapacityLimiter(options.capacity)
        self._context = contextvars.Context()
        """What the handlers' tasks start from: a copy of the context `run` was called in."""
        self._give_up_at = math.inf
        self._over = False
        """`run` returned: a handler that ends after that reports nothing."""
        self._failure: BaseException | None = None
        self._timer = trio.CancelScope()
        self._offline = trio.CancelScope()
        """Around connecting and the back-off: cancelled once drained, as no hub is needed."""
        self._nursery: trio.Nursery | None = None
        self._sockets: trio.Nursery | None = None
        self._health = _Health()
        self._available: int | None = None
        """Slots available as last told by `share_slots`, until `run` applies it."""

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
            connected=self._health.connected,
            last_error=self._health.last_error,
        )

    def events(self) -> trio.MemoryReceiveChannel[WorkerEvent]:
        """The notices, 128 buffered; when nobody reads, new ones are dropped and counted.
        The channel closes when `run` returns."""
        return self._events_out

    def share_slots(self, available: int) -> None:
        """Only `available` of the capacity's slots may be used from now on (0 to the
        capacity): something else takes the others. Starts stop while none is free, and
        the hub is told the capacity left at once. Call it on the Trio thread."""
        self._available = available
        if self._ran and not self._over:
            now_ms, stimulus_id = self._stamp("slots")
            self._apply(
                CapacityChanged(now_ms=now_ms, stimulus_id=stimulus_id, available=available)
            )

    # ------------------------------------------------------------------ run

    async def run(self) -> None:
        """Work until the surrounding scope is cancelled, then drain and return (as
        Trio does: the cancellation goes on to the scope). Lost connections are made
        again with back-off; `WorkerRunError` (naming the URL, with a `code`) when one
        fails in a way retrying cannot heal: the hub refused the worker (`FATAL`), the
        upgrade was answered with an HTTP error that is not transient, the TLS
        certificate failed verification (all at once), or the peer does not speak the
        protocol (three times in a row). `WorkerShutdownTimeout` if the drain overran."""
        if self._ran:
            raise WorkerAlreadyRun()
        self._ran = True
        self._clock = self._clock or EpochClock()
        self._context = contextvars.copy_context()
        if self._available is not None:
            self.share_slots(self._available)
        finished = trio.Event()
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._live, finished)
                try:
                    await finished.wait()
                except trio.Cancelled:
                    with trio.CancelScope(shield=True):
                        await self._drain(finished)
                    raise
        finally:
            with trio.CancelScope(shield=True):
                await self._let_go()
            self._events_in.close()
            if self._failure is not None:
                raise self._failure  # it ends the run, whatever else was going on

    async def _drain(self, finished: trio.Event) -> None:
        now_ms, stimulus_id = self._stamp("drain")
        self._apply(DrainRequested(now_ms=now_ms, stimulus_id=stimulus_id))
        with trio.move_on_after(self._options.shutdown_timeout_ms / 1000):
            await finished.wait()
            return
        self._fail(
            WorkerShutdownTimeout(
                f"the drain did not finish within {self._options.shutdown_timeout_ms} ms",
                unconfirmed=self._core.unconfirmed,
                running=self._core.running,
                attempts=tuple(self._handlers),
            )
        )
        self._cancel_handlers()
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()
        await finished.wait()  # what is left of the connection closes within a second

    async def _let_go(self) -> None:
        """Cancels the handlers still running, waits for them until `EXIT_GRACE_S` after
        the first cancel, and leaves any still running behind."""
        self._cancel_handlers()
        with trio.move_on_at(self._give_up_at):
            for handling in list(self._handlers.values()):
                await handling.ended.wait()
        self._over = True

    def _cancel_handlers(self) -> None:
        self._give_up_at = min(self._give_up_at, trio.current_time() + EXIT_GRACE_S)
        for handling in self._handlers.values():
            handling.cancel()

    def _fail(self, error: BaseException) -> None:
        """What `run` raises: the first failure, whatever followed from it."""
        if self._failure is None:
            self._failure = error

    async def _live(self, finished: trio.Event) -> None:
        """Everything the worker does but its handlers, shielded: only the drain or its
        timeout ends it."""
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
                            self._fail(error)
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

    def _apply(self, event: Event, *, settle: bool = True) -> None:
        """Hand `event` to the core and carry out what it says; with `settle`, then set the
        timer and see whether the drain is over (`_settle`)."""
        for command in self._core.handle(event).commands:
            self._execute(command)
        if settle:
            self._settle()

    def _settle(self) -> None:
        """The timer follows the core's next deadline; a drained core needs no hub. Once per
        step of the runtime: the deadline is a pass over every attempt the core knows."""
        deadline = self._core.next_deadline_ms()
        assert self._clock is not None
        self._timer.deadline = math.inf if deadline is None else self._clock.trio_time(deadline)
        if self._core.drained():
            self._offline.cancel()

    def _execute(self, command: Command) -> None:
        match command:
            case Send(messages=messages):
                self._outbox.extend(messages)
                self._outbox_ready.set()
            case RunHandler(offer=offer, lease_deadline_ms=deadline_ms):
                self._start_handler(offer, deadline_ms)
            case SetLease(attempt_id=attempt_id, lease_deadline_ms=deadline_ms):
                running = self._handlers.get(attempt_id)
                if running is not None and self._clock is not None:
                    running.scope.deadline = self._clock.trio_time(deadline_ms)
            case CancelHandler(attempt_id=attempt_id):
                running = self._handlers.get(attempt_id)
                if running is not None:
                    running.cancel()
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

    def _start_handler(self, offer: Offer, lease_deadline_ms: int) -> None:
        assert self._clock is not None
        scope = trio.CancelScope(deadline=self._clock.trio_time(lease_deadline_ms))
        handling = _Handling(offer=offer, scope=scope)
        self._handlers[offer.attempt_id] = handling
        trio.lowlevel.spawn_system_task(self._run_handler, handling, context=self._context.copy())

    async def _run_handler(self, handling: _Handling) -> None:
        """One handler, as a system task (see the module): it raises nothing but the
        `Cancelled` of the end of `trio.run`."""
        attempt_id = handling.offer.attempt_id
        try:
            outcome = await self._outcome_of(handling)
            if not self._over:
                now_ms, stimulus_id = self._stamp("returned")
                returned = HandlerReturned(
                    now_ms=now_ms, stimulus_id=stimulus_id, attempt_id=attempt_id, outcome=outcome
                )
                self._apply(returned)
        except trio.Cancelled:
            raise
        except BaseException as error:  # KeyboardInterrupt from the handler, or a fault here
            self._fail(error)
            if self._nursery is not None:
                self._nursery.cancel_scope.cancel()
        finally:
            del self._handlers[attempt_id]
            handling.ended.set()

    async def _outcome_of(self, handling: _Handling) -> Outcome:
        offer = handling.offer
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
            cancel_signal=handling.signal,
        )
        value: Any = None
        error: BaseException | None = None
        try:
            if handler.in_thread:
                # Out of the lease's scope: a lost lease signals the thread and waits for it.
                value = await trio.to_thread.run_sync(
                    handler.handle, execution, limiter=self._threads, abandon_on_cancel=True
                )
            else:
                with handling.scope:
                    value = await handler.handle(execution)
        except (trio.Cancelled, KeyboardInterrupt):
            raise
        except BaseException as raised:  # the handler's failure is the report
            error = raised
        if handling.scope.cancel_called:
            return _handlers.lease_lost()
        if error is not None:
            return _handlers.raised(error)
        return _handlers.returned(value)

    # ------------------------------------------------------------------ connections

    async def _connections(self) -> WorkerRunError | None:
        """Connect, serve, and after a loss reconnect with back-off, until drained; the
        error a failure that cannot heal ended the run with (see `_classify`)."""
        options = self._options
        delay_ms = options.reconnect_min_delay_ms
        while not self._core.drained():
            try:
                with self._until_drained() as offline:
                    stream, socket = await self._connect()
                if offline.cancelled_caught:
                    break
                delay_ms = options.reconnect_min_delay_ms
                self._health.connected = True
                try:
                    await self._serve(socket)
                finally:
                    self._health.connected = False
                    with trio.CancelScope(shield=True), trio.move_on_after(1):
                        await socket.aclose()
                    # trio-websocket leaves the stream open when the hub went away first.
                    await trio.aclose_forcefully(stream)
            except Exception as error:
                failure = error.failure if isinstance(error, _Failed) else _classify(error, None)
                if self._health.failed(failure):
                    ended = WorkerRunError(
                        f"{self._client.url}: {failure.reason}",
                        code=failure.code,
                        unconfirmed=self._core.unconfirmed,
                        running=self._core.running,
                        attempts=tuple(self._handlers),
                    )
                    ended.__cause__ = error.__cause__ if isinstance(error, _Failed) else error
                    return ended
                warn = self._health.warns(now_s=trio.current_time())
                logger.log(
                    logging.WARNING if warn else logging.INFO,
                    "hub %s: %s; connecting again after a back-off",
                    self._client.url,
                    failure.reason,
                )
            if self._core.drained():
                break
            sleep_ms = self._rng.uniform(options.reconnect_min_delay_ms, delay_ms)
            delay_ms = min(options.reconnect_max_delay_ms, delay_ms * 2)
            with self._until_drained():
                await trio.sleep(sleep_ms / 1000)
        return None

    def _until_drained(self) -> trio.CancelScope:
        self._offline = trio.CancelScope()
        if self._core.drained():
            self._offline.cancel()
        return self._offline

    async def _connect(self) -> tuple[trio.abc.Stream, trio_websocket.WebSocketConnection]:
        """A WebSocket whose hello was welcomed, and the stream it runs on; `_Failed`
        saying why not, judged with what the stream saw."""
        stream: _Watched | None = None
        try:
            with trio.fail_after(HANDSHAKE_TIMEOUT_S):
                stream = _Watched(await self._client.open_stream())
                socket = await self._open_websocket(stream)
                try:
                    await self._hello(socket)
                except BaseException:
                    with trio.CancelScope(shield=True), trio.move_on_after(1):
                        await socket.aclose()
                    raise
        except BaseException as error:
            if stream is not None:
                await trio.aclose_forcefully(stream)
            if isinstance(error, Exception):
                raise _Failed(_classify(error, stream)) from error
            raise
        return stream, socket

    async def _hello(self, socket: trio_websocket.WebSocketConnection) -> None:
        """Says hello; returns once the hub welcomed it."""
        hello = Hello(protocol_version=PROTOCOL_VERSION, credential=self._client.credential)
        await socket.send_message(encode([hello]))
        first, *more = decode(await socket.get_message())  # never empty
        if isinstance(first, Error):
            _raise_error(first)
        if more or not isinstance(first, Welcome):
            names = ", ".join(type(message).__name__ for message in (first, *more))
            raise ProtocolError(reason=f"expected one welcome, got {names}")

    async def _open_websocket(self, stream: _Watched) -> trio_websocket.WebSocketConnection:
        """The WebSocket's opening handshake on `stream`; `trio.BrokenResourceError` if the
        connection ends first (trio-websocket would wait for the handshake regardless)."""
        assert self._sockets is not None
        nursery = await self._sockets.start(self._socket_tasks, stream)
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
        stream.upgraded = True
        return ended[0]

    async def _socket_tasks(
        self, stream: _Watched, *, task_status: trio.TaskStatus[trio.Nursery]
    ) -> None:
        """Where trio-websocket runs one connection's reader, open until the stream ends.
        What the reader raises (`ConnectionRejected` when the upgrade is answered with an
        HTTP status, a wsproto error) ends that connection, never the worker."""
        try:
            async with trio.open_nursery() as nursery:
                task_status.started(nursery)
                await stream.ended.wait()
        except* Exception as group:
            logger.debug("hub connection's reader ended: %r", group.exceptions)
            await trio.aclose_forcefully(stream)

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
                except Exception as error:  # raised below, not as a group of one
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
            try:
                for message in decode(frame):
                    if isinstance(message, Error):
                        _raise_error(message)
                    if isinstance(message, Welcome | Hello):
                        raise ProtocolError(reason=f"unexpected {type(message).__name__}")
                    now_ms, stimulus_id = self._stamp("received")
                    received = Received(now_ms=now_ms, stimulus_id=stimulus_id, message=message)  # type: ignore[arg-type]
                    self._apply(received, settle=False)
            finally:
                self._settle()  # once for the frame: nothing waits in between

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
    """A connection's stream that tells when it ended (closed, reset, or at its end), and
    keeps what judges a failed handshake: the first bytes heard and the first error."""

    inner: trio.abc.Stream
    ended: trio.Event = attrs.Factory(trio.Event)
    head: bytearray = attrs.Factory(bytearray)
    """The first `HEAD_BYTES` received: the answer to the WebSocket upgrade."""
    error: Exception | None = None
    upgraded: bool = False
    """The WebSocket's opening handshake succeeded."""

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        try:
            await self.inner.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as error:
            self._broke(error)
            raise

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        try:
            data = await self.inner.receive_some(max_bytes)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as error:
            self._broke(error)
            raise
        if not data:
            self.ended.set()
        self.head += data[: HEAD_BYTES - len(self.head)]
        return data

    async def aclose(self) -> None:
        self.ended.set()
        await self.inner.aclose()

    def _broke(self, error: Exception) -> None:
        self.error = self.error or error
        self.ended.set()


class _Failed(Exception):
    """A connection could not be made; `failure` says why and whether that can heal."""

    def __init__(self, failure: _Failure) -> None:
        self.failure = failure
        super().__init__(failure.reason)


@attrs.frozen
class _Failure:
    """Why a connection failed or ended. `code` is empty for a transient failure; else
    `ends_after` in a row with that code end `run`."""

    reason: str
    code: str = ""
    ends_after: int = 0


@attrs.define
class _Health:
    """How the connection to the hub fares: what `stats` shows, whether a failure ends
    `run`, and whether it is time to warn again."""

    connected: bool = False
    last_error: str = ""
    _code: str = ""
    _in_a_row: int = 0
    _warned_at_s: float = -math.inf

    def failed(self, failure: _Failure) -> bool:
        """Notes `failure`; whether it ends the run."""
        self.last_error = failure.reason
        self._in_a_row = self._in_a_row + 1 if failure.code == self._code else 1
        self._code = failure.code
        return bool(failure.code) and self._in_a_row >= failure.ends_after

    def warns(self, *, now_s: float) -> bool:
        """Whether a failure at `now_s` is logged as a warning (at most every `WARN_EVERY_S`)."""
        if now_s - self._warned_at_s < WARN_EVERY_S:
            return False
        self._warned_at_s = now_s
        return True


_TRANSIENT: Final = (
    OSError,
    trio.BrokenResourceError,
    trio.TooSlowError,
    trio_websocket.HandshakeError,
    trio_websocket.ConnectionClosed,
    _Closed,
)
PROTOCOL_CLOSE_CODES: Final = frozenset({1002, 1003, 1007})
"""WebSocket close codes that say a frame broke the protocol (RFC 6455, 7.4.1)."""


def _classify(error: Exception, stream: _Watched | None) -> _Failure:
    """What `error` (and what `stream`, if the connection was being made, saw) means:
    an error the hub sent, a certificate that failed verification, an answer to the
    upgrade that is not the protocol, a frame the protocol does not allow, or else a
    transient failure (`_TRANSIENT`); anything other is a fault of this worker."""
    causes = [*_causes(error), *(_causes(stream.error) if stream and stream.error else ())]
    untrusted = [cause for cause in causes if isinstance(cause, ssl.SSLCertVerificationError)]
    if isinstance(error, _Fatal):
        return _Failure(f"the hub ended the session: {error}", error.error.code.value, AT_ONCE)
    if untrusted:
        reason = untrusted[0].verify_message or untrusted[0].reason or str(untrusted[0])
        trusted = [cause.trusted for cause in causes if isinstance(cause, HubCertificateRejected)]
        against = f" against {trusted[0]}" if trusted else ""
        return _Failure(
            f"TLS certificate verification failed{against}: {reason}", "TLS_CERTIFICATE", AT_ONCE
        )
    if broken := _broken_protocol(error):
        return _Failure(broken, "PROTOCOL_ERROR", IN_A_ROW)
    if stream is not None and stream.head and not stream.upgraded:
        return _answered(bytes(stream.head))
    tls = [cause for cause in causes if type(cause) is ssl.SSLError]
    if tls:
        return _Failure(f"the TLS handshake failed: {tls[0].reason}", "TLS_FAILED", IN_A_ROW)
    if isinstance(error, _TRANSIENT):
        return _Failure("; ".join(dict.fromkeys(_describe(cause) for cause in causes[:3])))
    return _Failure(f"unexpected {type(error).__name__}: {error}", "UNEXPECTED", AT_ONCE)


def _broken_protocol(error: Exception) -> str:
    """How `error` says the peer broke the protocol; "" if it does not."""
    if isinstance(error, ProtocolError):
        return str(error)
    closed = error.reason if isinstance(error, trio_websocket.ConnectionClosed) else None
    if closed is not None and closed.code in PROTOCOL_CLOSE_CODES:
        return (
            f"not the WebSocket protocol: closed with {closed.code} {closed.name} ({closed.reason})"
        )
    return ""


def _answered(head: bytes) -> _Failure:
    """What an answer to the WebSocket upgrade that did not complete it (`head`, all the
    peer sent before the connection ended or the handshake timed out) means."""
    http = h11.Connection(h11.CLIENT)
    upgrade = [("host", "hub"), ("connection", "Upgrade"), ("upgrade", "websocket")]
    http.send(h11.Request(method="GET", target=WORKER_PATH, headers=upgrade))
    http.send(h11.EndOfMessage())
    http.receive_data(head)
    http.receive_data(b"")
    try:
        answer = http.next_event()
    except h11.RemoteProtocolError:
        answer = None
    if not isinstance(answer, h11.Response | h11.InformationalResponse):
        return _Failure(
            "the upgrade was answered with something that is not HTTP", "NOT_A_HUB", IN_A_ROW
        )
    status = f"HTTP {answer.status_code} {answer.reason.decode(errors='replace')}".rstrip()
    if answer.status_code == 101:
        return _Failure(
            f"the upgrade was answered {status} with a handshake that does not check out",
            "NOT_A_HUB",
            IN_A_ROW,
        )
    if answer.status_code in (408, 429) or answer.status_code >= 500:
        return _Failure(f"the upgrade was answered {status}")
    return _Failure(f"the upgrade was answered {status}", "UPGRADE_REFUSED", AT_ONCE)


def _causes(error: BaseException) -> list[Exception]:
    """`error`, what caused it or was being handled, and the members of groups among them."""
    seen: list[BaseException] = []
    waiting = [error]
    while waiting and len(seen) < MAX_CAUSES:
        cause = waiting.pop(0)
        if any(cause is known for known in seen):
            continue
        seen.append(cause)
        if isinstance(cause, BaseExceptionGroup):
            waiting.extend(cause.exceptions)
        waiting.extend(c for c in (cause.__cause__, cause.__context__) if c is not None)
    return [c for c in seen if isinstance(c, Exception) and not isinstance(c, BaseExceptionGroup)]


def _describe(error: BaseException) -> str:
    return str(error) or type(error).__name__


def _raise_error(error: Error) -> None:
    if error.code in FATAL:
        raise _Fatal(error)
    raise _Closed(f"{error.code.value}: {error.message}")
