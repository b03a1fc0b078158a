"""The worker protocol as bytes on the wire: an HTTP upgrade, then WebSocket frames.

`WireReader` cuts one direction of a connection into pieces a test can look
at, or leave out: the HTTP head whole, then each WebSocket frame (RFC 6455
section 5.2) whole, with the hub protocol messages it carries. The test proxy
(tests/e2e/tcp_proxy.py) and the virtual-clock taps use it. It reads what the
worker and the hub send (no extensions; each message one binary frame) and
passes anything else through as raw bytes.
"""

from __future__ import annotations

import re
from typing import Final

import attrs

from blockx.hubwire import Message, ProtocolError, decode

BINARY: Final = 0x2
_HEAD_END: Final = b"\r\n\r\n"
_UPGRADE: Final = re.compile(rb"^upgrade:\s*websocket\s*$", re.IGNORECASE | re.MULTILINE)
_SWITCHING: Final = re.compile(rb"^HTTP/1\.1 101 ")


@attrs.frozen(kw_only=True)
class Piece:
    """Bytes of one direction, as they were sent: a head, a frame, or other bytes."""

    data: bytes
    messages: tuple[Message, ...] = ()
    """The hub protocol messages of a binary frame (none for anything else)."""


def _unmasked(payload: bytes, key: bytes) -> bytes:
    if not payload:
        return payload
    mask = (key * (len(payload) // 4 + 1))[: len(payload)]
    value = int.from_bytes(payload, "big") ^ int.from_bytes(mask, "big")
    return value.to_bytes(len(payload), "big")


def _frame_at(buffer: bytearray) -> tuple[int, int, bytes] | None:
    """(frame length, opcode, unmasked payload) of the whole frame the buffer starts
    with, or None while it is not all there."""
    if len(buffer) < 2:
        return None
    first, second = buffer[0], buffer[1]
    length, offset = second & 0x7F, 2
    if length == 126:
        if len(buffer) < 4:
            return None
        length, offset = int.from_bytes(buffer[2:4], "big"), 4
    elif length == 127:
        if len(buffer) < 10:
            return None
        length, offset = int.from_bytes(buffer[2:10], "big"), 10
    key = b""
    if second & 0x80:  # masked: what a client sends
        if len(buffer) < offset + 4:
            return None
        key, offset = bytes(buffer[offset : offset + 4]), offset + 4
    end = offset + length
    if len(buffer) < end:
        return None
    payload = bytes(buffer[offset:end])
    return end, first & 0x0F, _unmasked(payload, key) if key else payload


def _messages(opcode: int, payload: bytes) -> tuple[Message, ...]:
    if opcode != BINARY:
        return ()
    try:
        return tuple(decode(payload))
    except ProtocolError:
        return ()


@attrs.define
class WireReader:
    """One direction of one connection, cut into `Piece`s as its bytes arrive."""

    _buffer: bytearray = attrs.Factory(bytearray)
    _mode: str = "head"
    """head (an HTTP head is coming), frames (WebSocket), or raw (anything else)."""

    def feed(self, data: bytes) -> list[Piece]:
        """The pieces `data` completes (bytes of an unfinished frame are kept back)."""
        self._buffer += data
        pieces: list[Piece] = []
        if self._mode == "head":
            end = self._buffer.find(_HEAD_END)
            if end < 0:
                return pieces
            head = bytes(self._buffer[: end + len(_HEAD_END)])
            del self._buffer[: len(head)]
            pieces.append(Piece(data=head))
            upgraded = _SWITCHING.match(head) or _UPGRADE.search(head)
            self._mode = "frames" if upgraded else "raw"
        if self._mode == "raw":
            if self._buffer:
                pieces.append(Piece(data=bytes(self._buffer)))
                self._buffer.clear()
            return pieces
        while (found := _frame_at(self._buffer)) is not None:
            end, opcode, payload = found
            pieces.append(
                Piece(data=bytes(self._buffer[:end]), messages=_messages(opcode, payload))
            )
            del self._buffer[:end]
        return pieces
