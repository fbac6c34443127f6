"""The keeper's wire format: a 4-byte length, a JSON header, then `size` raw bytes.

Small on purpose: a keeper holds opaque files; everything that decides whether those
bytes are a checkpoint (manifest, checksums, safe loading) stays with the reader.
"""
from __future__ import annotations

import json
import socket
import struct

_LENGTH = struct.Struct("!I")
MAX_HEADER = 1 << 20
SMALL = 1 << 20


class WireError(OSError):
    """The other side closed the connection or sent something that is not a message."""


def send(sock: socket.socket, header: dict, payload: bytes | memoryview = b"") -> None:
    header = {**header, "size": len(payload)}
    raw = json.dumps(header).encode()
    # One write per message where the payload is small: a header sent alone waits on the
    # peer's delayed ACK (Nagle), about 40 ms per file; large payloads go as they are.
    head = _LENGTH.pack(len(raw)) + raw
    if len(payload) <= SMALL:
        sock.sendall(head + bytes(payload))
    else:
        sock.sendall(head)
        sock.sendall(payload)


def no_delay(sock: socket.socket) -> socket.socket:
    """Requests and replies are small and answered at once: never hold them back."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def receive(sock: socket.socket) -> tuple[dict, bytes]:
    (length,) = _LENGTH.unpack(_exactly(sock, _LENGTH.size))
    if length > MAX_HEADER:
        raise WireError(f"header of {length} bytes: not a keeper message")
    try:
        header = json.loads(_exactly(sock, length))
    except ValueError as exc:
        raise WireError(f"header is not JSON: {exc}") from None
    if not isinstance(header, dict) or not isinstance(header.get("size", 0), int):
        raise WireError("header is not a JSON object with an integer size")
    return header, _exactly(sock, header.get("size", 0))


def _exactly(sock: socket.socket, n: int) -> bytes:
    buffer = bytearray(n)
    view, got = memoryview(buffer), 0
    while got < n:
        read = sock.recv_into(view[got:], n - got)
        if read == 0:
            raise WireError("connection closed mid-message")
        got += read
    return bytes(buffer)
