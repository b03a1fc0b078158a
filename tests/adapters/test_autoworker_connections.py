"""Which connection failures end `Worker.run` and which are retried, on Trio's virtual clock.

Failures that retrying cannot heal end `run` with `WorkerRunError` naming the URL: the
hub refusing the credential, an upgrade answered with an HTTP status that is not
transient, a TLS certificate the worker does not trust (all at once), a peer that does
not speak the protocol (three times in a row). Others are retried with back-off and
warned about at most every 30 s. The fake peers are tiny servers on loopback port 0.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import hashlib
import logging
import socket
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Final

import attrs
import pytest
import trio
import trio.testing
import trustme

from blockx.autoworker import HubClient, HubRequestFailed, Worker, WorkerRunError
from blockx.hub import Right
from blockx.hubwire import HeartbeatAck, encode
from blockx.process.clock import EpochClock
from tests.adapters.autoworker_rig import SQLITE, RigClient, options
from tests.adapters.hub_harness import EPOCH_MS, QUEUE, running_hub

ENDS_WITHIN_S: Final = 15
RUNTIME_LOGGER: Final = "blockx.autoworker._runtime"
WEBSOCKET_GUID: Final = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

Peer = Callable[[trio.abc.Stream], Awaitable[None]]


@attrs.define(eq=False)
class FakePeer:
    """A server on loopback that answers each connection with a `Peer`, and counts them."""

    url: str
    connections: int = 0


@contextlib.asynccontextmanager
async def serving(
    peer: Peer, *, scheme: str = "http", ssl_context: ssl.SSLContext | None = None
) -> AsyncIterator[FakePeer]:
    async with trio.open_nursery() as nursery:
        fake = FakePeer(url="")

        async def handle(tcp: trio.SocketStream) -> None:
            fake.connections += 1
            stream: trio.abc.Stream = tcp
            if ssl_context is not None:
                stream = trio.SSLStream(tcp, ssl_context, server_side=True)
            # The worker may drop a connection at any time: that ends this one only.
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                await peer(stream)
            await trio.aclose_forcefully(stream)

        [listener] = await nursery.start(
            functools.partial(trio.serve_tcp, host="127.0.0.1"), handle, 0
        )
        fake.url = f"{scheme}://127.0.0.1:{listener.socket.getsockname()[1]}"
        yield fake
        nursery.cancel_scope.cancel()


def fake_worker(url: str, ssl_context: ssl.SSLContext | None = None) -> Worker:
    client = HubClient(url=url, credential="bxc_test.secret", ssl_context=ssl_context)
    return Worker(client, options(), clock=EpochClock(epoch_ms=EPOCH_MS))


async def run_error(auto: Worker, within_s: float = ENDS_WITHIN_S) -> WorkerRunError:
    with trio.fail_after(within_s), pytest.raises(WorkerRunError) as ended:
        await auto.run()
    return ended.value


# ------------------------------------------------------------------------- fake peers


async def until_closed(stream: trio.abc.Stream) -> None:
    """Reads (and drops) what comes until the worker closes its end."""
    while await stream.receive_some():
        pass


async def upgrade_request(stream: trio.abc.Stream) -> bytes:
    """The worker's upgrade request, up to its blank line."""
    request = b""
    while b"\r\n\r\n" not in request:
        request += await stream.receive_some()
    return request


def switching_protocols(request: bytes, extra_header: bytes = b"") -> bytes:
    """A proper answer to the upgrade `request` (RFC 6455, 4.2.2)."""
    [key] = [
        line.split(b":", 1)[1].strip()
        for line in request.split(b"\r\n")
        if line.lower().startswith(b"sec-websocket-key:")
    ]
    accept = base64.b64encode(hashlib.sha1(key + WEBSOCKET_GUID).digest())
    return (
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Accept: " + accept + b"\r\n" + extra_header + b"\r\n"
    )


def binary_frame(payload: bytes) -> bytes:
    """One unmasked binary WebSocket frame, as a server sends it (short payloads only)."""
    assert len(payload) < 126
    return bytes([0x82, len(payload)]) + payload


def answering(answer: bytes, *, then: str) -> Peer:
    """Reads the upgrade request, sends `answer`, then closes or waits for the worker to."""

    async def peer(stream: trio.abc.Stream) -> None:
        await upgrade_request(stream)
        await stream.send_all(answer)
        if then == "wait":
            await until_closed(stream)

    return peer


def upgrading_then(sent: bytes, extra_header: bytes = b"") -> Peer:
    """Completes the upgrade (with `extra_header`), sends `sent` and waits."""

    async def peer(stream: trio.abc.Stream) -> None:
        request = await upgrade_request(stream)
        await stream.send_all(switching_protocols(request, extra_header) + sent)
        await until_closed(stream)

    return peer


# ----------------------------------------------------------------- what ends the run


@pytest.mark.parametrize(
    ("answer", "then", "status"),
    [
        (b"HTTP/1.1 404 Not Found\r\nContent-Length: 9\r\n\r\nnot found", "wait", "404"),
        (b"HTTP/1.1 401 Unauthorized\r\nContent-Length: 0\r\n\r\n", "close", "401"),
        (b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\n\r\n<html>a page</html>", "close", "200"),
    ],
    ids=["404-kept-open", "401-closed", "200-html"],
)
async def test_an_upgrade_answered_with_an_http_status_ends_the_run_at_once(
    autojump_clock: trio.testing.MockClock, answer: bytes, then: str, status: str
) -> None:
    async with serving(answering(answer, then=then)) as fake:
        auto = fake_worker(fake.url)
        ended = await run_error(auto)
    assert ended.code == "UPGRADE_REFUSED"
    assert fake.url in str(ended)
    assert f"HTTP {status}" in str(ended)
    assert fake.connections == 1
    assert auto.stats().last_error in str(ended)


@pytest.mark.parametrize(
    ("peer", "within_s"),
    [
        (answering(b"\x15\x03\x01\x00\x02\x02\x46", then="close"), ENDS_WITHIN_S),
        (answering(b"SSH-2.0-OpenSSH_9.6\r\n", then="wait"), 60),  # three handshake timeouts
        (answering(b"\x00garbage\r\n\r\n", then="wait"), ENDS_WITHIN_S),
    ],
    ids=["closes", "waits", "garbage-head"],
)
async def test_a_peer_answering_the_upgrade_with_what_is_not_http_ends_the_run_third_time(
    autojump_clock: trio.testing.MockClock, peer: Peer, within_s: float
) -> None:
    async with serving(peer) as fake:
        ended = await run_error(fake_worker(fake.url), within_s)
    assert ended.code == "NOT_A_HUB"
    assert "not HTTP" in str(ended)
    assert fake.url in str(ended)
    assert fake.connections == 3


@pytest.mark.parametrize(
    ("peer", "code"),
    [
        (upgrading_then(binary_frame(b"\xc1")), "PROTOCOL_ERROR"),  # not msgpack
        (upgrading_then(b"\x8f\x00"), "PROTOCOL_ERROR"),  # a reserved opcode: close code 1002
        (upgrading_then(binary_frame(encode([HeartbeatAck(session_ttl_ms=1)]))), "PROTOCOL_ERROR"),
        (upgrading_then(b"", b"Sec-WebSocket-Protocol: chat\r\n"), "NOT_A_HUB"),
    ],
    ids=["not-msgpack", "bad-frame", "not-a-welcome", "unasked-subprotocol"],
)
async def test_a_peer_breaking_the_protocol_after_the_upgrade_ends_the_run_third_time(
    autojump_clock: trio.testing.MockClock, peer: Peer, code: str
) -> None:
    async with serving(peer) as fake:
        ended = await run_error(fake_worker(fake.url))
    assert ended.code == code
    assert fake.url in str(ended)
    assert fake.connections == 3


async def test_a_certificate_the_worker_does_not_trust_ends_the_run_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    trustme.CA().issue_cert("127.0.0.1").configure_cert(server_context)
    trusting_another_ca = ssl.create_default_context()
    trustme.CA().configure_trust(trusting_another_ca)
    async with serving(until_closed, scheme="wss", ssl_context=server_context) as fake:
        ended = await run_error(fake_worker(fake.url, trusting_another_ca))
    assert ended.code == "TLS_CERTIFICATE"
    assert fake.url in str(ended)
    assert "certificate verification failed" in str(ended)
    assert "unable to get local issuer certificate" in str(ended)  # ssl's own reason
    assert fake.connections == 1


@SQLITE
@pytest.mark.parametrize(
    ("rights", "code"),
    [(None, "AUTH_FAILED"), ((Right.PRODUCER,), "PERMISSION_DENIED")],
    ids=["unknown-credential", "no-worker-right"],
)
async def test_a_hub_refusing_the_credential_ends_the_run_at_once(
    hub_url: str,
    autojump_clock: trio.testing.MockClock,
    rights: tuple[Right, ...] | None,
    code: str,
) -> None:
    async with running_hub(hub_url) as rig:
        token = "bxc_nobody.secret" if rights is None else rig.credential(QUEUE, *rights)
        client = RigClient(url="http://hub.test:80", credential=token, endpoint=rig)
        auto = Worker(client, options(), clock=EpochClock(epoch_ms=EPOCH_MS))
        ended = await run_error(auto)
    assert ended.code == code
    assert "http://hub.test:80" in str(ended)
    assert auto.stats().reconnects == 0


# ---------------------------------------------------------------- what is retried


@pytest.mark.parametrize("status", [b"503 Service Unavailable", b"429 Too Many Requests"])
async def test_an_upgrade_answered_with_a_transient_status_is_tried_again(
    autojump_clock: trio.testing.MockClock, status: bytes
) -> None:
    answer = b"HTTP/1.1 " + status + b"\r\nContent-Length: 0\r\n\r\n"
    async with serving(answering(answer, then="close")) as fake:
        auto = fake_worker(fake.url)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(auto.run)
            await trio.sleep(20)
            retried = auto.stats()
            cancelled_at = trio.current_time()
            nursery.cancel_scope.cancel()
        # Holding nothing and with no hub up, the drain is done at once.
        assert trio.current_time() == cancelled_at
    assert fake.connections > 3
    assert f"HTTP {status.decode()}" in retried.last_error


@attrs.define(eq=False)
class Switch:
    down: bool = True


@attrs.frozen(kw_only=True)
class Refusing(RigClient):
    """While `switch.down`, connects to `url`, a port nobody listens on: refused."""

    switch: Switch = attrs.field(repr=False)

    async def open_stream(self) -> trio.abc.Stream:
        if self.switch.down:
            return await HubClient.open_stream(self)
        return await super().open_stream()


async def until_connected(auto: Worker) -> None:
    while not auto.stats().connected:
        await trio.sleep(0.05)


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        record.getMessage()
        for record in caplog.records
        if record.name == RUNTIME_LOGGER and record.levelno == logging.WARNING
    ]


@SQLITE
async def test_a_refused_connection_is_retried_with_a_warning_every_30_s_until_the_hub_is_up(
    hub_url: str, autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=RUNTIME_LOGGER)
    with socket.socket() as unlistened:  # bound, never listening: connections are refused
        unlistened.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{unlistened.getsockname()[1]}"
        async with running_hub(hub_url) as rig:
            switch = Switch()
            client = Refusing(url=url, credential=rig.credential(), endpoint=rig, switch=switch)
            auto = Worker(client, options(), clock=EpochClock(epoch_ms=EPOCH_MS))
            async with trio.open_nursery() as nursery:
                nursery.start_soon(auto.run)
                await trio.sleep(29.9)
                in_first_window, down = warnings(caplog), auto.stats()
                await trio.sleep(6)  # past 30 s; the back-off is at most 5 s
                in_two_windows = warnings(caplog)
                switch.down = False
                with trio.fail_after(6):
                    await until_connected(auto)
                up = auto.stats()
                nursery.cancel_scope.cancel()
    [warning] = in_first_window
    assert url in warning
    assert "Connection refused" in warning
    assert len(in_two_windows) == 2
    tries = [r for r in caplog.records if "Connection refused" in r.getMessage()]
    assert len(tries) > 6  # the others at INFO
    assert down.connected is False
    assert "Connection refused" in down.last_error
    assert up.connected is True
    assert auto.stats().connected is False  # drained and closed


async def test_wss_to_a_port_that_does_not_speak_tls_ends_the_run_third_time(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def plain_http(stream: trio.abc.Stream) -> None:
        await stream.send_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")

    async with serving(plain_http, scheme="wss") as fake:
        ended = await run_error(fake_worker(fake.url))
    assert ended.code == "TLS_FAILED"
    assert fake.url in str(ended)
    assert fake.connections == 3


async def test_a_producer_request_answered_with_a_page_keeps_its_text_as_the_body(
    autojump_clock: trio.testing.MockClock,
) -> None:
    page = b"HTTP/1.1 404 Not Found\r\nContent-Length: 19\r\n\r\n<html>a page</html>"
    async with serving(answering(page, then="close")) as fake:
        client = HubClient(url=fake.url, credential="bxc_test.secret")
        with pytest.raises(HubRequestFailed) as failed:
            await client.task("t1")
    assert (failed.value.status, failed.value.body) == (404, "<html>a page</html>")
