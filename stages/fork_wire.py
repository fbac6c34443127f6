"""Messages between a launch, the fork server and its warm processes (stages.zygote):
length-prefixed JSON over a unix socket, with file descriptors passed alongside
(SCM_RIGHTS) where a launch hands over its standard streams."""
from __future__ import annotations

import json
import socket
import struct

HEADER = struct.Struct("!I")
# What a launch is: a stage's torchrun ranks, or one plain process (a Ray worker of the RL
# roles: stages.rl.warm_worker), which gets none of torchrun's variables.
TORCHRUN, PROCESS = "torchrun", "process"
MAX_BYTES = 16 << 20


def send(sock: socket.socket, message: dict, fds: tuple[int, ...] = ()) -> None:
    body = json.dumps(message).encode()
    data = HEADER.pack(len(body)) + body
    sent = socket.send_fds(sock, [data], list(fds)) if fds else sock.send(data)
    if sent < len(data):
        sock.sendall(data[sent:])


def receive(sock: socket.socket, max_fds: int = 0) -> tuple[dict | None, list[int]]:
    """The next message and the descriptors that came with it; (None, []) when the other
    side closed the connection first. Reads exactly one message: a second one sent right
    behind it stays in the socket."""
    if max_fds:
        head, fds, _flags, _address = socket.recv_fds(sock, HEADER.size, max_fds)
    else:
        head, fds = sock.recv(HEADER.size), []
    head += _exactly(sock, HEADER.size - len(head)) if head else b""
    if len(head) < HEADER.size:
        return None, fds
    (length,) = HEADER.unpack(head)
    if length > MAX_BYTES:
        raise ValueError(f"a fork-server message of {length} bytes (at most {MAX_BYTES})")
    body = _exactly(sock, length)
    return (json.loads(body), fds) if len(body) == length else (None, fds)


def _exactly(sock: socket.socket, count: int) -> bytes:
    """`count` bytes, or fewer when the connection closed first."""
    data = b""
    while len(data) < count:
        more = sock.recv(count - len(data))
        if not more:
            break
        data += more
    return data
