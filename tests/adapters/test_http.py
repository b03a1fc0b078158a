"""The HTTP/1.1 layer the hub's port and the metrics port share (`blockx.net.http`), over an
in-memory stream: requests one after another on a kept connection (also sent without
waiting), bodies in pieces or chunked, when a connection is kept or closed, and the 4xx
answers to what cannot be read."""

from __future__ import annotations

import json

import pytest
import trio
import trio.testing

from blockx.net.http import (
    MAX_REQUEST_HEAD_BYTES,
    BadRequest,
    Connection,
    read_body,
    read_request_head,
    respond,
    respond_keeping,
)

LIMIT = 1_000
"""The body limit of the application below."""


async def echo_app(stream: trio.abc.HalfCloseableStream, log: list[str]) -> None:
    """Answers each request with what it read of it, keeping the connection while it may."""
    connection = Connection()
    received = bytearray()
    while (request := await read_request_head(stream, connection, received)) is not None:
        log.append(f"{request.method.decode()} {request.target.decode()}")
        try:
            body = await read_body(stream, connection, request, LIMIT)
        except BadRequest as error:
            await respond(stream, error.status, f"{error}\n")
            return
        answer = {
            "body": body.decode(),
            "headers": [[name.decode(), value.decode()] for name, value in request.headers],
            "upgrade": request.upgrade,
            "received": len(received),
        }
        received = bytearray()
        text = json.dumps(answer)
        if not await respond_keeping(
            stream, connection, request, 200, text, content_type="application/json"
        ):
            return


async def exchange(*pieces: bytes) -> tuple[bytes, list[str]]:
    """Send `pieces` one after another (each awaited by the server), then the end of the
    client's side; everything the server sent before it closed, and what it read."""
    client, server = trio.testing.memory_stream_pair()
    log: list[str] = []
    out = bytearray()
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:

            async def serve() -> None:
                async with server:
                    await echo_app(server, log)

            nursery.start_soon(serve)
            for piece in pieces:
                await client.send_all(piece)
                await trio.testing.wait_all_tasks_blocked()
            await client.send_eof()
            while chunk := await client.receive_some():
                out += chunk
    return bytes(out), log


def responses(data: bytes) -> list[tuple[str, dict[str, str], bytes]]:
    """(status line, headers, body) of each response in `data`."""
    found = []
    while data:
        head, _, rest = data.partition(b"\r\n\r\n")
        status, *lines = head.decode("latin-1").split("\r\n")
        headers = dict(line.split(": ", 1) for line in lines)
        size = int(headers["content-length"])
        found.append((status, headers, rest[:size]))
        data = rest[size:]
    return found


async def test_requests_sent_without_waiting_are_answered_in_order_on_one_connection() -> None:
    data, log = await exchange(
        b"GET /one HTTP/1.1\r\nhost: h\r\n\r\n"
        b"POST /two HTTP/1.1\r\nhost: h\r\ncontent-length: 5\r\n\r\nhello"
        b"GET /three HTTP/1.1\r\nhost: h\r\nX-Mixed-Case: Yes\r\n\r\n"
    )
    assert log == ["GET /one", "POST /two", "GET /three"]
    answers = responses(data)
    assert [status for status, _, _ in answers] == ["HTTP/1.1 200 OK"] * 3
    assert all("connection" not in headers for _, headers, _ in answers)
    bodies = [json.loads(body) for _, _, body in answers]
    assert bodies[1]["body"] == "hello"
    assert ["x-mixed-case", "Yes"] in bodies[2]["headers"]


async def test_a_body_in_pieces_or_chunked_is_read_whole() -> None:
    head = b"POST /p HTTP/1.1\r\nhost: h\r\ncontent-length: 12\r\n\r\n"
    data, _ = await exchange(head[:7], head[7:], b"hello ", b"wor", b"ld!")
    assert json.loads(responses(data)[0][2])["body"] == "hello world!"
    chunked = (
        b"POST /c HTTP/1.1\r\nhost: h\r\ntransfer-encoding: chunked\r\n\r\n"
        b"5\r\nhello\r\n1\r\n \r\n6\r\nworld!\r\n0\r\n\r\n"
    )
    data, _ = await exchange(chunked[:60], chunked[60:])
    assert json.loads(responses(data)[0][2])["body"] == "hello world!"


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"GET /old HTTP/1.0\r\n\r\nGET /never HTTP/1.0\r\n\r\n",
        b"GET /bye HTTP/1.1\r\nhost: h\r\nconnection: close\r\n\r\nGET /never HTTP/1.1\r\n\r\n",
    ],
    ids=["http/1.0", "connection-close"],
)
async def test_a_client_that_does_not_keep_the_connection_gets_one_answer(
    request_bytes: bytes,
) -> None:
    data, log = await exchange(request_bytes)
    assert len(log) == 1
    ((status, headers, _),) = responses(data)
    assert (status, headers["connection"]) == ("HTTP/1.1 200 OK", "close")


async def test_bodies_over_the_limit_or_badly_framed_are_refused_naming_why() -> None:
    big = b"x" * (LIMIT + 1)
    head = f"POST /big HTTP/1.1\r\nhost: h\r\ncontent-length: {len(big)}\r\n\r\n".encode()
    data, _ = await exchange(head, big)
    ((status, _, body),) = responses(data)
    assert (status, body) == (
        "HTTP/1.1 413 Request Entity Too Large",
        f"a request body of more than {LIMIT} bytes\n".encode(),
    )
    broken = b"POST /c HTTP/1.1\r\nhost: h\r\ntransfer-encoding: chunked\r\n\r\n"
    data, _ = await exchange(broken, b"zz\r\nhello\r\n")
    ((status, _, body),) = responses(data)
    assert status == "HTTP/1.1 400 Bad Request"
    assert body.strip()


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (b"\x16\x03\x01 not http at all\r\n\r\n", "HTTP/1.1 400 Bad Request"),
        (b"GET / HTTP/1.1\r\nbad header\r\n\r\n", "HTTP/1.1 400 Bad Request"),
        (
            b"GET / HTTP/1.1\r\nx: " + b"a" * MAX_REQUEST_HEAD_BYTES + b"\r\n\r\n"
            b"GET /after HTTP/1.1\r\nhost: h\r\n\r\n",
            "HTTP/1.1 431 Request Header Fields Too Large",
        ),
    ],
    ids=["garbage", "header-without-colon", "head-too-large"],
)
async def test_a_head_that_cannot_be_read_is_answered_4xx_and_closed(
    request_bytes: bytes, status: str
) -> None:
    data, log = await exchange(request_bytes)
    assert log == []
    ((answered, headers, body),) = responses(data)
    assert (answered, headers["connection"]) == (status, "close")
    assert body.startswith(b"bad request: ")


async def test_a_client_that_leaves_halfway_through_a_head_gets_nothing() -> None:
    data, log = await exchange(b"GET /metr")
    assert (data, log) == (b"", [])


async def test_an_upgrade_request_is_not_kept_and_every_byte_read_is_there_to_replay() -> None:
    upgrade = (
        b"GET /ws HTTP/1.1\r\nhost: h\r\nconnection: Upgrade\r\nupgrade: websocket\r\n"
        b"sec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\nsec-websocket-version: 13\r\n\r\n"
    )
    data, log = await exchange(upgrade[:20], upgrade[20:] + b"\x81\x05hello")
    assert log == ["GET /ws"]
    ((_, headers, body),) = responses(data)
    answer = json.loads(body)
    assert answer["upgrade"] is True
    assert answer["received"] == len(upgrade) + 7  # the frame after the head too
    assert headers["connection"] == "close"
