"""The hub server: worker sessions over WebSocket and the producers' HTTP JSON API, one port.

`GET /v1/worker` upgrades to the worker protocol (`blockx.hubwire`);
`GET /metrics` is for Prometheus (`_metrics`); `/ui` and `/assets/` are the
dashboard (`_ui`), which reads `/v1/workers`, `/v1/stats` and `/v1/events`
(`_live`); everything else under `/v1/` is the producers' API (see `_api`)
and the operators' (`_review`); with a certificate set (`tlsCertFile`), all
over TLS only (HTTPS and WSS). Behind them is the committer (`_committer`),
the only writer of the database: every answer a worker gets was committed
first.

Per connection, a reader decodes frames and hands each control message to
the committer as an operation with its receipt; answers go to the
connection's outbox as they are committed, and a writer sends whatever the
outbox holds in one frame. So a worker may pipeline, and many answers share
one commit. In memory the hub keeps only what it can lose: the open
sessions, with the attempts each holds (to offer no more than the capacity
the worker declared). The dispatcher offers work to sessions with room, the
sweeper ends lapsed offers and leases; both write through the committer.
Offers ride on commits already under way where they can: a submission shares
its transaction with the claims of the sessions waiting for work, and a finish
that frees a place claims the task that takes it in its own.
"""

from __future__ import annotations

import contextlib
import functools
import heapq
import logging
import ssl
from collections.abc import Awaitable, Callable, Sequence
from typing import Final

import attrs
import msgpack  # type: ignore[import-untyped]  # ships no type information
import trio
import trio_websocket

from blockx.errors import StartupError
from blockx.hub import _ops
from blockx.hub._api import TaskWatch
from blockx.hub._auth import authenticate
from blockx.hub._browser import BrowserSessions
from blockx.hub._committer import Committer
from blockx.hub._config import HubConfig
from blockx.hub._live import EVENTS_PATH, Live, WorkerView
from blockx.hub._metrics import METRICS_PATH, HubMetrics, SessionLoad
from blockx.hub._model import Credential, Right
from blockx.hub._review import OperatorApi
from blockx.hub._store import QueuedListener, Store, StoreError
from blockx.hub._ui import Dashboard
from blockx.hubwire import (
    MAX_CAPACITY,
    MAX_FRAME_BYTES,
    MAX_FRAME_MESSAGES,
    PROTOCOL_VERSION,
    WORKER_PATH,
    AttemptStatus,
    Capability,
    ControlMessage,
    Drain,
    DrainAck,
    Error,
    ErrorCode,
    Finish,
    Heartbeat,
    HeartbeatAck,
    Hello,
    Message,
    Offer,
    OpenSession,
    ProtocolError,
    RefusalCode,
    Renew,
    Resume,
    Resumed,
    SessionOpened,
    Start,
    Welcome,
    decode,
    encode,
    encode_message,
    frame,
)
from blockx.net.http import (
    Connection,
    Request,
    accept_websocket,
    is_websocket_upgrade,
    read_request_head,
    respond,
    serve_guarded,
)
from blockx.net.tls import HTTP1_ALPN, server_context
from blockx.process.clock import EpochClock

logger = logging.getLogger("blockx.hub")

TLS_HANDSHAKE_TIMEOUT_S: Final = 10.0
"""How long a client may take over its TLS handshake once connected."""
HELLO_TIMEOUT_S: Final = 10.0
"""How long a worker may take to send its hello once connected."""
_FRAME_ROOM: Final = MAX_FRAME_BYTES - 3
"""What the messages of one frame may take: a frame's array header takes up to 3 bytes."""
REQUEST_TIMEOUT_S: Final = 60.0
"""For a producer's whole request, its answer included."""
SWEEP_LIMIT: Final = 1_000
RETENTION_BATCH: Final = 500
"""Tasks (or receipts) deleted per transaction once they outlived their retention."""
REVOCATION_CHECK_MS: Final = 500
"""How often the hub looks whether the credentials of its connections were revoked (by
a command, through the API, or by another hub): so a revoked worker goes within 1 s."""
MAX_PENDING: Final = 1_024
"""Control messages of one connection awaiting their answers before the hub reads no more."""
MAX_UNSENT: Final = MAX_PENDING + MAX_CAPACITY + 1_024
"""Messages waiting to be sent to one worker: its answers, its offers and a margin."""
_KEEPS_ATTEMPT: Final = frozenset(
    {RefusalCode.NOT_STARTED, RefusalCode.TOO_LARGE, RefusalCode.INVALID_REPORT}
)
"""Refusals after which the worker still holds the attempt (it may report again)."""
_UNAVAILABLE: Final = Error(
    code=ErrorCode.UNAVAILABLE, message="the hub cannot reach its database; reconnect later"
)
_REVOKED: Final = Error(code=ErrorCode.AUTH_FAILED, message="the credential was revoked")
_GOING_AWAY: Final = Error(
    code=ErrorCode.UNAVAILABLE, message="the hub is shutting down; reconnect later"
)
_SHUTTING_DOWN: Final = '{"error": "the hub is shutting down; try another hub, or again later"}\n'
POLICY_VIOLATION: Final = 1008
GOING_AWAY: Final = 1001
"""WebSocket close codes (RFC 6455, 7.4.1): a session ended for what the worker did, and
one ended because the hub stops."""


class _Closed(Exception):
    """The session must end: `error` says why, to the worker."""

    def __init__(self, error: Error) -> None:
        self.error = error
        super().__init__(error.message)


@attrs.define(eq=False)
class _Link:
    """One worker connection: where its answers go, how many it awaits, and how to end it."""

    outbox: trio.MemorySendChannel[bytes]
    scope: trio.CancelScope
    reading: trio.CancelScope = attrs.Factory(trio.CancelScope)
    """Around the reader: cancelled when the hub drains, so it takes no more messages."""
    fatal: Error | None = None
    credential_id: str = ""
    """The credential its hello carried, once accepted."""
    pending: int = 0
    """Control messages taken and not answered yet."""
    _room: trio.Event = attrs.Factory(trio.Event)
    _settled: trio.Event = attrs.Factory(trio.Event)

    def send(self, encoded: bytes) -> None:
        # A connection that is gone takes nothing: the worker resumes elsewhere.
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            try:
                self.outbox.send_nowait(encoded)
            except trio.WouldBlock:
                message = f"more than {MAX_UNSENT} messages unread: the worker does not read"
                self.fail(Error(code=ErrorCode.PROTOCOL_ERROR, message=message))

    def taken(self) -> None:
        self.pending += 1

    def answered(self) -> None:
        self.pending -= 1
        if self.pending < MAX_PENDING:
            self._room.set()
        if self.pending == 0:
            self._settled.set()

    async def settled(self) -> None:
        """Until every message taken from this worker has its answer in the outbox."""
        while self.pending:
            self._settled = trio.Event()
            await self._settled.wait()

    async def wait_for_room(self) -> None:
        """Until fewer than `MAX_PENDING` of this worker's messages await their answers:
        a worker that sends faster than the hub commits is slowed down, not buffered."""
        while self.pending >= MAX_PENDING:
            self._room = trio.Event()
            await self._room.wait()

    def fail(self, error: Error) -> None:
        """End the connection, telling the worker why."""
        if self.fatal is None:
            self.fatal = error
        self.scope.cancel()


@attrs.define(eq=False)
class _InProgress:
    """How many things are under way (worker connections, producers' requests), and a wait
    until none is. `with in_progress:` counts one for as long as it lasts (a plain context
    manager: it wraps every request)."""

    count: int = 0
    _none: trio.Event = attrs.Factory(trio.Event)

    def __enter__(self) -> None:
        self.count += 1

    def __exit__(self, *_: object) -> None:
        self.count -= 1
        if self.count == 0:
            self._none.set()

    async def none(self) -> None:
        while self.count:
            self._none = trio.Event()
            await self._none.wait()


@attrs.define(eq=False)
class _Session:
    instance_id: str
    queue_id: str
    link: _Link
    capabilities: tuple[Capability, ...]
    opened_at_ms: int
    last_heard_ms: int
    """When the worker's last message came (of any kind)."""
    capacity: int = 0
    held: dict[str, AttemptStatus] = attrs.Factory(dict)
    """Attempts offered to or started by this worker and not yet ended."""
    opened: bool = False
    """Its opening is committed and answered: offers may follow."""
    draining: bool = False
    offering: bool = False
    """A claim for this session is in the committer: no second one meanwhile."""
    look_again: bool = False
    """There may be work it did not see: claim again as soon as it returns."""
    closed: bool = False

    @property
    def room(self) -> int:
        if self.draining or self.closed or not self.opened:
            return 0
        return max(self.capacity - len(self.held), 0)

    def send(self, encoded: bytes) -> None:
        if not self.closed:
            self.link.send(encoded)

    def view(self) -> WorkerView:
        return WorkerView(
            instance_id=self.instance_id,
            queue_id=self.queue_id,
            credential_id=self.link.credential_id,
            capabilities=self.capabilities,
            capacity=self.capacity,
            held=dict(self.held),
            opened_at_ms=self.opened_at_ms,
            last_heard_ms=self.last_heard_ms,
            draining=self.draining,
        )


class Hub:
    """One hub process. Start `run` with `nursery.start`; it reports the bound port.
    `lanes`: more connections to `store`'s PostgreSQL database for the committer."""

    def __init__(
        self,
        config: HubConfig,
        store: Store,
        *,
        clock: EpochClock | None = None,
        use_thread: bool = True,
        lanes: Sequence[Store] = (),
    ) -> None:
        self.config = config
        self._store = store
        self._use_thread = use_thread
        self._clock = clock = clock or EpochClock()
        watch = TaskWatch()
        self.metrics = HubMetrics(clock.now_ms)
        self.committer = Committer(
            store,
            use_thread=use_thread,
            tails=(watch, self.metrics),
            meter=self.metrics,
            lanes=lanes,
        )
        self.hub_id = _ops.new_id()
        self._ids = ids = _ops.TimeOrderedIds(self._clock.now_ms)
        """Task and attempt ids, and the tasks' submission order."""
        self._timing = config.timing
        self._sessions: dict[str, _Session] = {}  # by instance id
        self._links: set[_Link] = set()
        """Every worker connection open now, a session on it or not yet."""
        self._in_progress = _InProgress()
        self.draining = False
        """Published: the hub takes no new work (see `drain`)."""
        self._wake_dispatcher = trio.Event()
        self._poll_s = config.poll_ms / 1000
        self._next_look = trio.CancelScope()
        self._looks: list[float] = []
        """Trio times the dispatcher was asked to look at before its next poll (a heap)."""
        self._sweep_by: trio.CancelScope | None = None
        self.browsers = BrowserSessions()  # the dashboard's sign-ins
        self.live = Live(
            self.committer,
            hub_id=self.hub_id,
            now_ms=clock.now_ms,
            series=self.metrics.series,
            workers=lambda: [session.view() for session in self._sessions.values()],
        )
        self.api = OperatorApi(
            self.committer,
            clock=clock,
            ids=ids,
            on_queued=self.offer_now,
            on_submit=self.wake,
            watch=watch,
            recheck_ms=config.poll_ms if store.postgres else None,
            browsers=self.browsers,
            more_admin=self.live.admin_request,
        )
        self.dashboard = Dashboard(
            self.committer, self.browsers, now_ms=clock.now_ms, secure=bool(config.tls_cert_file)
        )

    def now_ms(self) -> int:
        return self._clock.now_ms()

    def wake(self) -> None:
        """There may be work to offer: the dispatcher looks now."""
        self._wake_dispatcher.set()

    async def run(
        self,
        host: str,
        port: int,
        *,
        stop: trio.Event | None = None,
        task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Serve on (host, port) until `stop` is set (never, if None), then `drain` and end.
        With `tlsCertFile` set, the port speaks HTTPS and WSS only; a TLS file that cannot
        be used ends the run before it listens (a ConfigError naming the setting)."""
        tls = server_context(*self.config.tls_files(), alpn=HTTP1_ALPN)
        serve = self.serve_connection if tls is None else functools.partial(self._serve_tls, tls)
        async with trio.open_nursery() as actors:
            await actors.start(self.run_actors)
            async with trio.open_nursery() as connections:
                listeners = await _listen(host, port)
                bound = int(listeners[0].socket.getsockname()[1])
                accepting = trio.CancelScope()
                connections.start_soon(self._accept, serve, listeners, connections, accepting)
                schemes = _schemes(self.config)
                logger.info("hub %s listening on %s:%d (%s)", self.hub_id, host, bound, schemes)
                task_status.started(bound)
                await (trio.Event() if stop is None else stop).wait()
                accepting.cancel()  # the listeners close: new connections are refused
                await self.drain()
                connections.cancel_scope.cancel()  # kept connections idle between requests
            actors.cancel_scope.cancel()
        logger.info("hub %s stopped", self.hub_id)

    async def _accept(
        self,
        serve: Callable[[trio.SocketStream], Awaitable[None]],
        listeners: list[trio.SocketListener],
        connections: trio.Nursery,
        scope: trio.CancelScope,
    ) -> None:
        with scope:
            await trio.serve_listeners(serve, listeners, handler_nursery=connections)

    async def drain(self) -> None:
        """Take no new work and let what was taken finish, within `drain_timeout_ms`.

        Producers' requests under way are answered, later ones refused (503); a
        worker's messages already read are committed and answered, then it is told
        the hub is going (`UNAVAILABLE`, close code 1001) and resumes elsewhere or
        later; no offer is made; every commit in flight finishes. Long polls
        (`wait_ms`) answer with the task as it is.
        """
        self.draining = True
        self.api.drain()
        self.live.ticker.stop()  # the dashboard's event streams end
        for session in self._sessions.values():
            session.draining = True  # nothing more is offered to it
        for link in self._links:
            link.reading.cancel()
        logger.info(
            "hub draining: %d worker connections, %d requests, up to %d ms",
            len(self._links),
            self._in_progress.count - len(self._links),
            self.config.drain_timeout_ms,
        )
        with trio.move_on_after(self.config.drain_timeout_ms / 1000) as bounded:
            await self._in_progress.none()
            await self.committer.idle()
        if bounded.cancelled_caught:
            logger.warning("hub drain timeout passed: what was still under way is cut off")

    async def run_actors(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """The committer, the dispatcher and the sweeper: `serve_connection` needs them running."""
        async with trio.open_nursery() as nursery:
            await nursery.start(self.committer.run)
            await nursery.start(self._dispatch)
            await nursery.start(self._sweep)
            await nursery.start(self._retain)
            await nursery.start(self._close_revoked)
            await nursery.start(self.live.ticker.run)
            if self._store.postgres:
                await nursery.start(self._hear_queued)
            task_status.started()

    # ---------------------------------------------------------------- connections

    async def _serve_tls(self, context: ssl.SSLContext, stream: trio.SocketStream) -> None:
        """One client connection over TLS: the handshake, within `TLS_HANDSHAKE_TIMEOUT_S`,
        then `serve_connection`. A client whose handshake fails is dropped and logged (a
        plain-text client, one that does not trust this hub, one without the client
        certificate asked for); one that just went away, at debug level only."""
        tls = trio.SSLStream(stream, context, server_side=True, https_compatible=True)
        try:
            with trio.fail_after(TLS_HANDSHAKE_TIMEOUT_S):
                await tls.do_handshake()
        except (trio.BrokenResourceError, trio.TooSlowError) as error:
            if isinstance(error, trio.TooSlowError):
                logger.info("hub: a client's TLS handshake took over %s s", TLS_HANDSHAKE_TIMEOUT_S)
            elif isinstance(error.__cause__, ssl.SSLError):
                logger.info("hub: a client's TLS handshake failed: %s", error.__cause__)
            else:
                logger.debug("hub: a client left during its TLS handshake: %r", error.__cause__)
            await trio.aclose_forcefully(tls)
            return
        await self.serve_connection(tls)

    async def serve_connection(self, stream: trio.abc.Stream) -> None:
        """One client connection (a worker's WebSocket, or one HTTP request), until it ends."""
        await serve_guarded(stream, self._serve, logger)

    async def _serve(self, stream: trio.abc.Stream) -> None:
        connection = Connection()
        received = bytearray()
        request = await read_request_head(stream, connection, received)
        if request is not None and is_websocket_upgrade(request) and _path(request) == WORKER_PATH:
            await accept_websocket(
                stream, bytes(received), self._worker, max_message_size=MAX_FRAME_BYTES
            )
            return
        while request is not None:  # the producers' requests, while the client keeps it
            with self._in_progress:
                if not await self._request(stream, connection, request):
                    return
            request = await read_request_head(stream, connection, bytearray())

    async def _request(
        self, stream: trio.abc.Stream, connection: Connection, request: Request
    ) -> bool:
        """Answer one producer's request; whether its connection is kept for the next."""
        path = _path(request)
        if path == WORKER_PATH:
            message = "GET /v1/worker with a WebSocket upgrade, first on its connection\n"
            await respond(stream, 400, message)
            return False
        if path == METRICS_PATH:  # answered while the hub drains too
            return await self.metrics.serve(
                stream,
                connection,
                request,
                committer=self.committer,
                sessions=self._loads,
                admin_only=self.config.metrics_admin_only,
                keep=not self.draining,
            )
        if self.draining:
            await respond(stream, 503, _SHUTTING_DOWN, content_type="application/json")
            return False
        if path == EVENTS_PATH:  # for as long as the client stays, or until the hub drains
            caller = self.browsers.caller(request, self.now_ms())
            return await self.live.serve_events(stream, connection, request, caller)
        with trio.move_on_after(REQUEST_TIMEOUT_S):
            if self.dashboard.serves(path):
                return await self.dashboard.serve(stream, connection, request, path)
            return await self.api.serve(stream, connection, request)
        return False  # it took too long: its connection is done

    # ------------------------------------------------------------------- sessions

    def _loads(self) -> list[SessionLoad]:
        return [
            SessionLoad(queue_id=s.queue_id, capacity=s.capacity, held=len(s.held))
            for s in self._sessions.values()
        ]

    async def _worker(self, socket: trio_websocket.WebSocketConnection) -> None:
        send, outbox = trio.open_memory_channel[bytes](MAX_UNSENT)
        link = _Link(outbox=send, scope=trio.CancelScope())
        sessions: list[_Session] = []
        self._links.add(link)
        if self.draining:
            link.reading.cancel()
        try:
            with self._in_progress:
                await self._serve_worker(socket, link, sessions, outbox)
                for session in sessions:
                    session.closed = True
                    if self._sessions.get(session.instance_id) is session:
                        del self._sessions[session.instance_id]
                if link.fatal is not None:
                    going = link.fatal is _GOING_AWAY
                    await _close(socket, link.fatal, GOING_AWAY if going else POLICY_VIOLATION)
        finally:
            self._links.discard(link)

    async def _serve_worker(
        self,
        socket: trio_websocket.WebSocketConnection,
        link: _Link,
        sessions: list[_Session],
        outbox: trio.MemoryReceiveChannel[bytes],
    ) -> None:
        """Read the worker's messages and write the answers, until either side ends it; when
        the hub drains, read no more and send the answers of what was read, then go."""
        with link.scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_write_frames, socket, outbox)
                with link.reading:
                    await self._read(socket, link, sessions)
                if link.reading.cancel_called and link.fatal is None:
                    await link.settled()
                    link.fatal = _GOING_AWAY
                    link.outbox.close()  # the writer sends what the outbox holds, then ends
                else:
                    nursery.cancel_scope.cancel()
        link.outbox.close()

    async def _read(
        self, socket: trio_websocket.WebSocketConnection, link: _Link, sessions: list[_Session]
    ) -> None:
        """Take the worker's frames until it leaves, or until it must be told to go."""
        session: _Session | None = None
        try:
            credential = await self._hello(socket)
            link.credential_id = credential.credential_id
            while True:
                await link.wait_for_room()
                for message in decode(await self._next_frame(socket)):
                    session = self._on_message(session, credential, link, message)
                    if not sessions:
                        sessions.append(session)
        except ProtocolError as error:
            link.fatal = Error(code=ErrorCode.PROTOCOL_ERROR, message=error.reason)
        except _Closed as closed:
            link.fatal = closed.error
        except trio_websocket.ConnectionClosed:
            pass

    async def _next_frame(self, socket: trio_websocket.WebSocketConnection) -> bytes | str:
        with trio.move_on_after(self.config.session_ttl_ms / 1000):
            return await socket.get_message()
        raise _Closed(
            Error(code=ErrorCode.SESSION_EXPIRED, message="nothing within the session TTL")
        )

    async def _hello(self, socket: trio_websocket.WebSocketConnection) -> Credential:
        with trio.move_on_after(HELLO_TIMEOUT_S):
            messages = decode(await socket.get_message())
            hello = messages[0]
            if len(messages) != 1 or not isinstance(hello, Hello):
                raise ProtocolError(reason="the first frame must hold one hello")
            if hello.protocol_version != PROTOCOL_VERSION:
                raise _Closed(
                    Error(
                        code=ErrorCode.VERSION_MISMATCH,
                        message=f"this hub speaks protocol {PROTOCOL_VERSION}",
                    )
                )
            try:
                credential = await authenticate(self.committer, hello.credential)
            except StoreError as error:
                logger.warning("hub: %s", error)
                raise _Closed(_UNAVAILABLE) from None
            if credential is None:
                raise _Closed(Error(code=ErrorCode.AUTH_FAILED, message="unknown credential"))
            await socket.send_message(
                encode([Welcome(protocol_version=PROTOCOL_VERSION, hub_id=self.hub_id)])
            )
            return credential
        raise _Closed(Error(code=ErrorCode.PROTOCOL_ERROR, message="no hello in time"))

    def _on_message(
        self, session: _Session | None, credential: Credential, link: _Link, message: Message
    ) -> _Session:
        if isinstance(message, OpenSession):
            if session is not None:
                raise ProtocolError(reason="a session is open already on this connection")
            return self._open(message, credential, link)
        if session is None:
            raise ProtocolError(reason=f"{type(message).__name__} before open_session")
        now_ms = session.last_heard_ms = self.now_ms()
        instance_id = session.instance_id
        match message:
            case Heartbeat(capacity=capacity):
                session.capacity = capacity
                session.send(
                    encode_message(HeartbeatAck(session_ttl_ms=self.config.session_ttl_ms))
                )
                self.wake()
            case Start():
                self._control(
                    session, message, _ops.start(message, instance_id, now_ms, self._timing)
                )
            case Renew():
                self._control(
                    session, message, _ops.renew(message, instance_id, now_ms, self._timing)
                )
            case Finish():
                self._finish(session, message, now_ms)
            case Resume(message_id=message_id, attempts=attempts):
                look = _ops.resume(attempts, instance_id, now_ms)
                self._control(
                    session, message, lambda tx: Resumed(reply_to=message_id, attempts=look(tx))
                )
            case Drain(message_id=message_id):
                session.draining = True
                offered = tuple(a for a, s in session.held.items() if s is AttemptStatus.OFFERED)
                self._control(
                    session, message, lambda tx: DrainAck(reply_to=message_id, offered=offered)
                )
            case _:
                raise ProtocolError(reason=f"a worker never sends {type(message).__name__}")
        return session

    def _open(self, message: OpenSession, credential: Credential, link: _Link) -> _Session:
        if not credential.allows(Right.WORKER, message.queue_id):
            raise _Closed(
                Error(
                    code=ErrorCode.PERMISSION_DENIED,
                    message=f"this credential may not run queue {message.queue_id!r}",
                )
            )
        old = self._sessions.get(message.instance_id)
        if old is not None:  # the instance reconnected: its old connection is done
            old.closed = True
            old.link.scope.cancel()
        now_ms = self.now_ms()
        session = _Session(
            instance_id=message.instance_id,
            queue_id=message.queue_id,
            link=link,
            capabilities=message.capabilities,
            opened_at_ms=now_ms,
            last_heard_ms=now_ms,
            capacity=message.capacity,
        )
        self._sessions[message.instance_id] = session
        ttl = self.config.session_ttl_ms
        reply_to = message.message_id
        self._control(
            session, message, lambda tx: SessionOpened(reply_to=reply_to, session_ttl_ms=ttl)
        )
        return session

    def _control(self, session: _Session, message: ControlMessage, decide: _ops.Decide) -> None:
        operation = _ops.answered(session.instance_id, message, self.now_ms(), decide)
        session.link.taken()
        self.committer.submit(
            operation, functools.partial(self._answered, session), key=session.instance_id
        )

    def _finish(self, session: _Session, message: Finish, now_ms: int) -> None:
        """A finish; if it ends an attempt the session holds and so frees a place, the offer
        that fills the place is claimed in the finish's own transaction (it is claimed only
        if the finish ended the attempt there and then, so the place is counted once)."""
        instance_id = session.instance_id
        frees_room = (
            session.held.get(message.attempt_id) is AttemptStatus.RUNNING
            and not (session.draining or session.closed)
            and session.capacity >= len(session.held)
        )
        if not frees_room:
            decide = _ops.finish(message, instance_id, now_ms, self._timing)
            self._control(session, message, decide)
            return
        claim = self._claim(session, room=1, now_ms=now_ms)
        operation = _ops.finished_then_offer(instance_id, message, now_ms, self._timing, claim)
        session.link.taken()
        self.committer.submit(
            operation, functools.partial(self._finished, session), key=session.instance_id
        )

    def _finished(
        self,
        session: _Session,
        result: tuple[bytes | _ops.Reused, list[Offer] | None] | StoreError,
    ) -> None:
        if isinstance(result, StoreError):
            self._answered(session, result)
            return
        answer, offers = result
        # The claim that ran with the finish looked for work for the place it freed.
        self._answered(session, answer, look=offers is None)
        if offers:
            self._take(session, offers)
            self._offer(session, self.now_ms())  # there may be more, and room for it

    def _answered(
        self, session: _Session, result: bytes | _ops.Reused | StoreError, *, look: bool = True
    ) -> None:
        session.link.answered()
        if isinstance(result, StoreError):
            logger.warning("hub: %s", result)
            session.link.fail(_UNAVAILABLE)
            return
        if isinstance(result, _ops.Reused):
            message = "a message id came again with another message"
            session.link.fail(Error(code=ErrorCode.MESSAGE_ID_REUSED, message=message))
            return
        session.send(result)
        answer = msgpack.unpackb(result)
        attempt_id = answer.get("attempt_id")
        match answer.get("type"):
            case "session_opened":  # offers follow the answer
                session.opened = True
                self.wake()
            case "granted":
                session.held[attempt_id] = AttemptStatus.RUNNING
                self._sweep_soon(answer["lease_deadline_ms"])
            case "refused" if RefusalCode(answer["code"]) not in _KEEPS_ATTEMPT:
                session.held.pop(attempt_id, None)
                if look:
                    self.wake()
            case "recorded":
                session.held.pop(attempt_id, None)
                if look:
                    self.wake()
            case "resumed":
                for item in answer["attempts"]:
                    status = AttemptStatus(item["status"])
                    if status is not AttemptStatus.LOST:
                        session.held[item["attempt_id"]] = status
            case _:
                pass

    # --------------------------------------------------------- the dispatcher

    async def _dispatch(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Offer work to sessions with room: when woken, at the times asked for (`wake_at`)
        and every `poll_ms` anyway."""
        task_status.started()
        while True:
            now = trio.current_time()
            while self._looks and self._looks[0] <= now:
                heapq.heappop(self._looks)
            look_at = min([now + self._poll_s, *self._looks[:1]])
            self._next_look = trio.CancelScope(deadline=look_at)
            with self._next_look:
                await self._wake_dispatcher.wait()
            self._wake_dispatcher = trio.Event()
            self.offer_now()

    def wake_at(self, at_ms: int) -> None:
        """There will be work to offer at `at_ms` (epoch ms): the dispatcher looks then. A
        time past the next poll is left to the poll (it offers within `poll_ms` of it)."""
        at = self._clock.trio_time(at_ms)
        if at <= trio.current_time():
            self.wake()
        elif at < self._next_look.deadline:
            heapq.heappush(self._looks, at)
            self._next_look.deadline = at

    def offer_now(self) -> None:
        """Claim offers for every session with room (`_offer`): operations handed to the
        committer just before share the claims' transaction."""
        now_ms = self.now_ms()
        for session in list(self._sessions.values()):
            self._offer(session, now_ms)

    def _offer(self, session: _Session, now_ms: int) -> None:
        """Claim offers for `session` if it has room; if a claim of its is in flight, claim
        again once it returns (it may have run before the work that asked for this one)."""
        if self.draining:
            return
        if session.offering:
            session.look_again = True
            return
        room = session.room
        if room > 0:
            session.offering = True
            claim = self._claim(session, room=room, now_ms=now_ms)
            # No key: a session's claims never overlap (`offering`), and a claim takes
            # nothing its control messages change, so neither waits for the other.
            self.committer.submit(claim, functools.partial(self._offered, session, room))

    def _claim(self, session: _Session, *, room: int, now_ms: int) -> _ops.Claim:
        return _ops.offer(
            session.queue_id,
            session.capabilities,
            session.instance_id,
            room=room,
            now_ms=now_ms,
            timing=self._timing,
            new_id=self._ids,
        )

    def _offered(self, session: _Session, room: int, result: list[Offer] | StoreError) -> None:
        session.offering = False
        if isinstance(result, StoreError):
            logger.warning("hub: %s", result)
            return
        self._take(session, result)
        if len(result) == room or session.look_again:  # more, or work it ran before
            session.look_again = False
            # Claimed before the committer's next batch: it joins the work waiting for it.
            self._offer(session, self.now_ms())

    def _take(self, session: _Session, offers: list[Offer]) -> None:
        """Send the session `offers` claimed for it; it holds them from now on."""
        for offer in offers:
            session.held[offer.attempt_id] = AttemptStatus.OFFERED
            session.send(encode_message(offer))
        if offers:
            self._sweep_soon(min(offer.offer_deadline_ms for offer in offers))

    # ------------------------------------------------------------ the sweeper

    async def _sweep(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """End lapsed offers, leases and queued tasks, at each one's due time."""
        task_status.started()
        while True:
            now_ms = self.now_ms()
            try:
                due_ms = await self._sweep_once(now_ms)
            except StoreError as error:
                logger.warning("hub: a sweep failed, tried again soon: %s", error)
                due_ms = now_ms + self.config.poll_ms * 5
            if due_ms <= now_ms:
                continue  # more are due already
            with trio.CancelScope(deadline=self._clock.trio_time(due_ms)) as scope:
                self._sweep_by = scope
                await trio.sleep_forever()
            self._sweep_by = None

    async def _sweep_once(self, now_ms: int) -> int:
        """One sweep; when the next one is due."""
        swept = await self.committer.do(_ops.sweep(now_ms, self._timing, SWEEP_LIMIT))
        for instance_id, attempt_id in swept.attempts:
            session = self._sessions.get(instance_id)
            if session is not None:
                session.held.pop(attempt_id, None)
        if swept.attempts or swept.timed_out:
            self.wake()
        if len(swept.attempts) >= SWEEP_LIMIT or swept.timed_out >= SWEEP_LIMIT:
            return now_ms
        due_ms = now_ms + self.config.poll_ms * 5
        if swept.next_due_ms is not None:
            due_ms = min(due_ms, max(swept.next_due_ms, now_ms + 1))
        return due_ms

    async def _retain(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Every `retention_sweep_ms`, delete the tasks that ended for good longer than
        `task_retention_ms` ago and the receipts older than `receipt_retention_ms`,
        `RETENTION_BATCH` per transaction: each batch is one short operation among the
        live work's, never a long one ahead of it."""
        task_status.started()
        config = self.config
        forgets = (
            (_ops.forget_tasks, config.task_retention_ms),
            (_ops.forget_receipts, config.receipt_retention_ms),
        )
        while True:
            await trio.sleep(config.retention_sweep_ms / 1000)
            try:
                for forget, retention_ms in forgets:
                    while True:
                        operation = forget(self.now_ms() - retention_ms, RETENTION_BATCH)
                        if await self.committer.do(operation) < RETENTION_BATCH:
                            break
            except StoreError as error:
                logger.warning("hub: a retention sweep failed, tried again soon: %s", error)

    async def _close_revoked(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Every `REVOCATION_CHECK_MS`, close the worker connections whose credential was
        revoked (`AUTH_FAILED`): one query for the credentials of every connection open."""
        task_status.started()
        while True:
            await trio.sleep(REVOCATION_CHECK_MS / 1000)
            credential_ids = frozenset(link.credential_id for link in self._links) - {""}
            if not credential_ids:
                continue
            try:
                revoked = await self.committer.do(_ops.revoked_among(credential_ids))
            except StoreError as error:
                logger.warning("hub: a look for revoked credentials failed: %s", error)
                continue
            for link in list(self._links):
                if link.credential_id in revoked:
                    link.fail(_REVOKED)

    async def _hear_queued(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """PostgreSQL: have the dispatcher look as soon as a commit of any hub (or command)
        of the database queued a task, or when its delay ends, not at its next poll. Started
        once it listens (or failed to): a commit before then is not heard, so a hub that
        served workers sooner would leave what it queued to the poll. A lost connection is
        made again after a poll's time; meanwhile the poll offers what was queued."""
        starting = True
        while True:
            try:
                if self._use_thread:
                    listener = await trio.to_thread.run_sync(QueuedListener, self._store.url)
                else:  # the database on the Trio thread, as the committer has it
                    listener = QueuedListener(self._store.url)
            except StoreError as error:
                logger.warning("hub: cannot listen for queued tasks: %s", error)
                listener = None
            if starting:
                task_status.started()
                starting = False
            if listener is None:
                await trio.sleep(self.config.poll_ms / 1000)
                continue
            try:
                while True:
                    await trio.lowlevel.wait_readable(listener.fileno())
                    for at_ms in listener.heard():
                        self.wake_at(at_ms)
            except StoreError as error:
                logger.warning("hub: lost the connection that hears queued tasks: %s", error)
            finally:
                listener.close()
            await trio.sleep(self.config.poll_ms / 1000)

    def _sweep_soon(self, due_ms: int) -> None:
        """Make the next sweep happen no later than `due_ms` (a deadline was just given out)."""
        if self._sweep_by is not None:
            self._sweep_by.deadline = min(self._sweep_by.deadline, self._clock.trio_time(due_ms))


async def _listen(host: str, port: int) -> list[trio.SocketListener]:
    """The hub's listeners; a port that cannot be had ends the start in one line."""
    try:
        return await trio.open_tcp_listeners(port, host=host)
    except OSError as error:
        reason = (error.strerror or str(error)).lower()
        raise StartupError(f"cannot listen on {host or '*'}:{port}: {reason}") from None


def _schemes(config: HubConfig) -> str:
    """What the port speaks, for the line that says the hub listens."""
    if not config.tls_cert_file:
        return "http and ws"
    if not config.tls_client_ca_file:
        return "https and wss"
    return f"https and wss; client certificates signed by a CA of {config.tls_client_ca_file}"


def _path(request: Request) -> str:
    return request.target.decode("ascii", "replace").partition("?")[0]


async def _write_frames(
    socket: trio_websocket.WebSocketConnection, outbox: trio.MemoryReceiveChannel[bytes]
) -> None:
    """Send what the outbox holds, as few frames as it takes (each within `MAX_FRAME_BYTES`)."""
    waiting: bytes | None = None
    while True:
        try:
            first = waiting if waiting is not None else await outbox.receive()
        except trio.EndOfChannel:
            return
        waiting = None
        batch, size = [first], len(first)
        while len(batch) < MAX_FRAME_MESSAGES:
            try:
                encoded = outbox.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel):
                break
            if size + len(encoded) > _FRAME_ROOM:
                waiting = encoded
                break
            batch.append(encoded)
            size += len(encoded)
        try:
            await socket.send_message(frame(batch))
        except trio_websocket.ConnectionClosed:
            return  # the reader sees it too


async def _close(socket: trio_websocket.WebSocketConnection, error: Error, code: int) -> None:
    """Tell the worker why, then close with `code`."""
    with trio.move_on_after(1), contextlib.suppress(trio_websocket.ConnectionClosed):
        await socket.send_message(encode([error]))
        await socket.aclose(code=code, reason=error.code.value)
