"""An in-process hub for protocol tests, and a scripted worker that speaks to it.

`running_hub(url)` runs a `Hub`'s actors on the test's (virtual) clock with
the database on the Trio thread, and connects clients to it through
in-memory streams: no sockets, so Trio's autojump clock sees every byte in
flight and a lease that must run out runs out exactly when the test sleeps
past it. `HubClient` sends protocol messages one by one and sorts what
comes back: answers by the message id they reply to, offers in arrival
order. `HubEndpoint` holds what the in-process hub shares with a hub process
reached over TCP (tests/e2e/hub_process.py).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any, Final

import attrs
import h11
import trio
import trio.testing
import trio_websocket

from blockx.hub import (
    Hub,
    HubConfig,
    Right,
    Store,
    create_credential,
    create_queue,
)
from blockx.hubwire import (
    MAX_FRAME_BYTES,
    PROTOCOL_VERSION,
    WORKER_PATH,
    Answer,
    Capability,
    ControlMessage,
    Error,
    ErrorCode,
    Finish,
    Granted,
    Hello,
    Message,
    Offer,
    OpenSession,
    Outcome,
    Renew,
    Start,
    Welcome,
    decode,
    encode,
)
from blockx.process.clock import EpochClock

EPOCH_MS: Final = 1_800_000_000_000
"""The hub's clock reading when a test starts: every time in a test is this plus virtual time."""
QUEUE: Final = "q1"
CAPABILITY: Final = Capability(handler="resize", handler_version="2", payload_version="1")
OTHER_CAPABILITY: Final = Capability(handler="resize", handler_version="3", payload_version="1")
TEST_CONFIG: Final = HubConfig(
    lease_ms=10_000,
    offer_ttl_ms=5_000,
    session_ttl_ms=600_000,
    retry_backoff_ms=1_000,
    max_retry_backoff_ms=4_000,
    poll_ms=200,
)
"""A session TTL long enough that a scripted worker need not send heartbeats."""
_MESSAGE_IDS: Final = itertools.count(1)


@attrs.define(eq=False)
class HubClient:
    """A scripted worker on one connection."""

    socket: trio_websocket.WebSocketConnection
    instance_id: str = ""
    offers: list[Offer] = attrs.Factory(list)
    answers: dict[str, list[Answer]] = attrs.Factory(dict)
    others: list[Message] = attrs.Factory(list)
    """Welcome, HeartbeatAck and Error, in arrival order."""

    @staticmethod
    def next_id() -> str:
        """A message id never used before in this run (ids are unique per instance, across
        its connections: a reused one ends the connection)."""
        return f"m{next(_MESSAGE_IDS)}"

    async def send(self, *messages: Message) -> None:
        await self.socket.send_message(encode(messages))

    async def receive(self) -> None:
        """Take one frame and sort its messages."""
        for message in decode(await self.socket.get_message()):
            reply_to = getattr(message, "reply_to", None)
            if isinstance(message, Offer):
                self.offers.append(message)
            elif reply_to is not None:
                self.answers.setdefault(reply_to, []).append(message)  # type: ignore[arg-type]
            else:
                self.others.append(message)

    async def listen(self, seconds: float) -> None:
        """Take (and sort) what arrives for `seconds`."""
        with trio.move_on_after(seconds):
            while True:
                await self.receive()

    async def answer(self, message_id: str) -> Answer:
        """The (next) answer to `message_id`."""
        while not self.answers.get(message_id):
            await self.receive()
        return self.answers[message_id].pop(0)

    async def request(self, message: ControlMessage) -> Answer:
        await self.send(message)
        return await self.answer(message.message_id)

    async def offer(self) -> Offer:
        """The oldest offer not taken yet, waiting for one if need be."""
        while not self.offers:
            await self.receive()
        return self.offers.pop(0)

    async def claim(self) -> Offer:
        """The next offer, started: its start must be granted."""
        offer = await self.offer()
        granted = await self.start(offer)
        assert isinstance(granted, Granted), granted
        return offer

    async def start(self, offer: Offer) -> Answer:
        return await self.request(self.start_message(offer))

    def start_message(self, offer: Offer) -> Start:
        return Start(message_id=self.next_id(), attempt_id=offer.attempt_id, epoch=offer.epoch)

    async def renew(self, offer: Offer) -> Answer:
        return await self.request(
            Renew(message_id=self.next_id(), attempt_id=offer.attempt_id, epoch=offer.epoch)
        )

    async def finish(self, offer: Offer, outcome: Outcome) -> Answer:
        return await self.request(self.finish_message(offer, outcome))

    def finish_message(self, offer: Offer, outcome: Outcome) -> Finish:
        return Finish(
            message_id=self.next_id(),
            attempt_id=offer.attempt_id,
            epoch=offer.epoch,
            outcome=outcome,
        )

    async def closed(self) -> Error | None:
        """Read until the hub closes the connection; the `Error` it sent last, if any."""
        try:
            while True:
                await self.receive()
        except trio_websocket.ConnectionClosed:
            pass
        errors = [message for message in self.others if isinstance(message, Error)]
        return errors[-1] if errors else None


@attrs.define
class Reply:
    """An HTTP answer: its status, its headers (names lower-cased) and its body."""

    status: int
    headers: list[tuple[str, str]] = attrs.Factory(list)
    content: bytearray = attrs.Factory(bytearray)

    @property
    def text(self) -> str:
        return self.content.decode()

    def json(self) -> Any:
        return json.loads(self.content)

    def header(self, name: str) -> str:
        """The value of header `name` ("" if absent; values of a repeated one joined)."""
        return ", ".join(value for key, value in self.headers if key == name)


GOING_AWAY: Final = 1001
"""The WebSocket close code of an endpoint that is going away (RFC 6455, 7.4.1)."""


def assert_told_to_go(worker: HubClient, error: Error | None) -> None:
    """The hub ended `worker`'s session because it stops: `UNAVAILABLE`, then close code
    1001 (`error` is what `HubClient.closed` returned)."""
    assert error is not None
    assert error.code is ErrorCode.UNAVAILABLE, error
    assert "shutting down" in error.message
    assert worker.socket.closed is not None
    assert worker.socket.closed.code == GOING_AWAY


@attrs.define(eq=False)
class HubEndpoint:
    """A hub to talk to; subclasses say how a connection is made."""

    nursery: trio.Nursery
    """Where a client connection's background tasks run."""

    async def open_stream(self) -> trio.abc.Stream:
        raise NotImplementedError

    @asynccontextmanager
    async def open_socket(self) -> AsyncIterator[trio_websocket.WebSocketConnection]:
        # Closes the stream itself too: trio-websocket leaves it open when the hub went away.
        async with await self.open_stream() as stream:
            socket = await trio_websocket.wrap_client_stream(
                self.nursery,
                stream,  # type: ignore[arg-type]  # any Stream serves; annotated narrower
                "hub.test",
                WORKER_PATH,
                max_message_size=MAX_FRAME_BYTES,
            )
            try:
                yield socket
            finally:
                await socket.aclose()

    @asynccontextmanager
    async def worker(
        self,
        token: str,
        *,
        instance_id: str = "w1",
        queue_id: str = QUEUE,
        capabilities: tuple[Capability, ...] = (CAPABILITY,),
        capacity: int = 4,
    ) -> AsyncIterator[HubClient]:
        """A worker whose session is open (hello answered with welcome, session opened)."""
        async with self.connected(token) as client:
            client.instance_id = instance_id
            await client.request(
                OpenSession(
                    message_id=client.next_id(),
                    instance_id=instance_id,
                    queue_id=queue_id,
                    capabilities=capabilities,
                    capacity=capacity,
                )
            )
            yield client

    @asynccontextmanager
    async def connected(self, token: str) -> AsyncIterator[HubClient]:
        """A client whose hello was answered with welcome."""
        async with self.open_socket() as socket:
            client = HubClient(socket=socket)
            await client.send(Hello(protocol_version=PROTOCOL_VERSION, credential=token))
            await client.receive()
            assert isinstance(client.others[-1], Welcome), client.others
            yield client

    async def http(
        self,
        method: str,
        target: str,
        *,
        token: str | None = None,
        body: object = None,
        raw: bytes | None = None,
    ) -> tuple[int, Any]:
        """One request to the producers' API: (status, the JSON body)."""
        status, text = await self.http_text(method, target, token=token, body=body, raw=raw)
        return status, json.loads(text)

    async def http_text(
        self,
        method: str,
        target: str,
        *,
        token: str | None = None,
        body: object = None,
        raw: bytes | None = None,
    ) -> tuple[int, str]:
        """One request to the producers' API: (status, the body's text as it came)."""
        data = raw if raw is not None else b"" if body is None else json.dumps(body).encode()
        headers = [] if token is None else [("authorization", f"Bearer {token}")]
        reply = await self.exchange(method, target, headers=headers, data=data)
        return reply.status, reply.text

    async def exchange(
        self,
        method: str,
        target: str,
        *,
        headers: Sequence[tuple[str, str]] = (),
        data: bytes = b"",
    ) -> Reply:
        """One request on a connection of its own, with `headers` (and `Host` and
        `Content-Length`): the answer."""
        stream = await self.open_stream()
        connection = h11.Connection(h11.CLIENT)
        sent = [("host", "hub.test"), ("content-length", str(len(data))), *headers]
        request = h11.Request(method=method, target=target, headers=sent)
        await stream.send_all(
            connection.send(request)
            + connection.send(h11.Data(data=data))
            + connection.send(h11.EndOfMessage())
        )
        reply = Reply(status=0)
        while True:
            event = connection.next_event()
            if event is h11.NEED_DATA:
                connection.receive_data(bytes(await stream.receive_some()))
            elif isinstance(event, h11.Response):
                reply.status = event.status_code
                reply.headers = [(n.decode(), v.decode()) for n, v in event.headers]
            elif isinstance(event, h11.Data):
                reply.content += event.data
            elif isinstance(event, h11.EndOfMessage):
                await stream.aclose()
                return reply

    async def submit(self, token: str, queue_id: str = QUEUE, **fields: object) -> dict[str, Any]:
        """Submit a task of `CAPABILITY` (unless `fields` say otherwise); the task's JSON."""
        document = {
            "handler": CAPABILITY.handler,
            "handler_version": CAPABILITY.handler_version,
            "payload_version": CAPABILITY.payload_version,
            "payload": {"n": 1},
            **fields,
        }
        status, task = await self.http(
            "POST", f"/v1/queues/{queue_id}/tasks", token=token, body=document
        )
        assert status == 201, task
        return dict(task)

    async def task(self, token: str, task_id: str) -> dict[str, Any]:
        status, task = await self.http("GET", f"/v1/tasks/{task_id}", token=token)
        assert status == 200, task
        return dict(task)


@attrs.define(eq=False)
class HubRig(HubEndpoint):
    """A hub in this process, reached through in-memory streams."""

    hub: Hub
    store: Store

    def now_ms(self) -> int:
        return self.hub.now_ms()

    def credential(self, queue_id: str = QUEUE, *rights: Right) -> str:
        return create_credential(
            self.store, queue_id, frozenset(rights or (Right.WORKER, Right.PRODUCER)), self.now_ms()
        )

    async def open_stream(self) -> trio.abc.HalfCloseableStream:
        client_stream, server_stream = trio.testing.memory_stream_pair()
        self.nursery.start_soon(self.hub.serve_connection, server_stream)
        return client_stream


@asynccontextmanager
async def running_hub(url: str, config: HubConfig = TEST_CONFIG) -> AsyncIterator[HubRig]:
    """A hub on `url` with queue `QUEUE`, its actors running; stopped (and the store closed)
    on exit."""
    store = Store(url)
    try:
        hub = Hub(config, store, clock=EpochClock(epoch_ms=EPOCH_MS), use_thread=False)
        create_queue(store, QUEUE, hub.now_ms())
        async with trio.open_nursery() as nursery:
            await nursery.start(hub.run_actors)
            yield HubRig(nursery=nursery, hub=hub, store=store)
            nursery.cancel_scope.cancel()
    finally:
        store.close()
