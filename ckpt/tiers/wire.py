"""The keeper's wire format: a 4-byte length, a JSON header, then `size` raw bytes.

Small on purpose: a keeper holds opaque files; everything that decides whether those
bytes are a checkpoint (manifest, checksums, safe loading) stays with the reader.
"""
from __future__ import annotations

import json
import os
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


def send_file(sock: socket.socket, header: dict, path) -> None:
    """A file as the payload, straight from the page cache to the socket (sendfile)."""
    with open(path, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        raw = json.dumps({**header, "size": size}).encode()
        sock.sendall(_LENGTH.pack(len(raw)) + raw)
        if size:
            sock.sendfile(handle)


def no_delay(sock: socket.socket) -> socket.socket:
    """Requests and replies are small and answered at once: never hold them back."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def receive(sock: socket.socket) -> tuple[dict, bytearray]:
    header = receive_header(sock)
    return header, _exactly(sock, header.get("size", 0))


def receive_header(sock: socket.socket) -> dict:
    """The header only; its `size` payload bytes follow on the socket."""
    (length,) = _LENGTH.unpack(_exactly(sock, _LENGTH.size))
    if length > MAX_HEADER:
        raise WireError(f"header of {length} bytes: not a keeper message")
    try:
        header = json.loads(_exactly(sock, length))
    except ValueError as exc:
        raise WireError(f"header is not JSON: {exc}") from None
    if not isinstance(header, dict) or not isinstance(header.get("size", 0), int):
        raise WireError("header is not a JSON object with an integer size")
    return header


def receive_into(sock: socket.socket, size: int, handle) -> None:
    """Stream `size` payload bytes into an open file in 4 MiB pieces: a multi-GB file is
    never held in memory whole."""
    piece = bytearray(min(size, 4 << 20))
    view, left = memoryview(piece), size
    while left:
        read = sock.recv_into(view[:min(left, len(piece))])
        if read == 0:
            raise WireError("connection closed mid-message")
        handle.write(view[:read])
        left -= read


def _exactly(sock: socket.socket, n: int) -> bytearray:
    """n bytes, received in place (no copy of the payload afterwards)."""
    buffer = bytearray(n)
    view, got = memoryview(buffer), 0
    while got < n:
        read = sock.recv_into(view[got:], n - got)
        if read == 0:
            raise WireError("connection closed mid-message")
        got += read
    return buffer
