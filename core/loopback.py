"""Every rendezvous store a run hosts listens on one address: 127.0.0.1 on one node, the
address that reaches `parallel.rdzv_endpoint` across nodes.

torch's TCPStore server binds all interfaces whatever host it is given, and it has no
authentication: while a stage runs, any host that reaches the machine could read and
write its rendezvous keys. torchrun's agent and rank 0 host such stores. The one way
torch offers to bind elsewhere is `master_listen_fd`, a socket the caller has bound
itself; `serve_stores_on` makes every store this process hosts use one bound to the
chosen address. Gloo's own sockets follow GLOO_SOCKET_IFNAME (the interface holding that
address).

The launcher's agent (stages.lifeline) puts ENV in its environment and the workers
inherit it (stages.lean_start, the saver processes). IPv4 only: an IPv6 endpoint leaves
torch's defaults (docs/tiers.md says what is then exposed).
"""
from __future__ import annotations

import datetime
import fcntl
import os
import socket
import struct
import sys

ENV = "BATON_LISTEN_ADDRESS"
LOOPBACK = "127.0.0.1"
SIOCGIFADDR = 0x8915


def listen_environment(address: str) -> dict[str, str]:
    """What a launch adds to its agent's and workers' environment to listen on `address`."""
    interface = interface_of(address)
    return {ENV: address, **({"GLOO_SOCKET_IFNAME": interface} if interface else {})}


def wanted() -> str | None:
    """The address this process's stores listen on, if its launcher chose one."""
    return os.environ.get(ENV) or None


def address_toward(host: str) -> str | None:
    """This machine's IPv4 address on the route to `host` (the endpoint's own address on
    the node that hosts it); None for a host without an IPv4 address."""
    try:
        target = socket.getaddrinfo(host, None, socket.AF_INET, socket.SOCK_DGRAM)[0][4][0]
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((target, 9))  # UDP: no packet is sent, the kernel picks a route
            return probe.getsockname()[0]
    except OSError:
        return None


def interface_of(address: str) -> str | None:
    """The network interface holding IPv4 `address` (`lo` for 127.0.0.1)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for _, name in socket.if_nameindex():
            try:
                raw = fcntl.ioctl(probe.fileno(), SIOCGIFADDR, struct.pack("256s", name[:15].encode()))
            except OSError:  # an interface without an IPv4 address
                continue
            if socket.inet_ntoa(raw[20:24]) == address:
                return name
    return None


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now, for a store or group started next on loopback."""
    with socket.socket() as probe:
        probe.bind((LOOPBACK, 0))
        return probe.getsockname()[1]


def bound_listener(address: str, port: int) -> tuple[int, int]:
    """A TCP socket listening on `address`:`port` (0: any free port): (its port, its fd).
    The fd is handed over: the store that receives it closes it. A port in use raises
    RuntimeError, as torch's own bind does (its rendezvous then joins as a client)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((address, port))
        sock.listen(socket.SOMAXCONN)
    except OSError as exc:
        sock.close()
        raise RuntimeError(f"the TCPStore could not listen on {address}:{port}: {exc}") from exc
    return sock.getsockname()[1], sock.detach()


def serve_stores_on(address: str) -> None:
    """From now on, a TCPStore this process hosts (is_master) listens on `address` only.
    Replaces the class where torch's modules hold it (imported or not yet); a store given
    its own `master_listen_fd` is left as it is."""
    import torch._C._distributed_c10d as c10d
    import torch.distributed as dist

    original = c10d.TCPStore
    if getattr(original, "_baton_listen_address", None) is not None:
        return

    class AddressedTCPStore(original):
        _baton_listen_address = address

        def __init__(self, host_name, port, world_size=None, is_master=False,
                     timeout=datetime.timedelta(seconds=300), wait_for_workers=True,
                     multi_tenant=False, master_listen_fd=None, use_libuv=True):
            if is_master and master_listen_fd is None:
                port, master_listen_fd = bound_listener(address, int(port))
            super().__init__(host_name, port, world_size, is_master, timeout, wait_for_workers,
                             multi_tenant, master_listen_fd, use_libuv)

    AddressedTCPStore.__name__ = AddressedTCPStore.__qualname__ = "TCPStore"
    c10d.TCPStore = dist.TCPStore = AddressedTCPStore
    for name, module in list(sys.modules.items()):
        if name.startswith("torch.distributed") and getattr(module, "TCPStore", None) is original:
            module.TCPStore = AddressedTCPStore
