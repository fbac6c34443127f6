"""Every rendezvous store a single-node run hosts listens on 127.0.0.1 only.

torch's TCPStore server binds all interfaces whatever host it is given, and it has no
authentication: while a stage runs, any host that reaches the machine could read and
write its rendezvous keys. torchrun's `--standalone` agent hosts two such stores. The
one way torch offers to bind elsewhere is `master_listen_fd`, a socket the caller has
bound itself; `serve_stores_on_loopback` makes every store this process hosts use one
bound to 127.0.0.1. Gloo's own sockets follow GLOO_SOCKET_IFNAME (set to `lo`).

The launcher sets ENV for single-node runs (stages.lifeline, the agent) and its workers
inherit it (stages.lean_start). Runs across nodes listen where `parallel.rdzv_endpoint`
says instead (docs/tiers.md).
"""
from __future__ import annotations

import datetime
import os
import socket
import sys

ENV = "BATON_LOOPBACK_ONLY"
LOOPBACK = "127.0.0.1"


def loopback_environment() -> dict[str, str]:
    """What a single-node launch adds to its agent's and workers' environment."""
    return {ENV: "1", "GLOO_SOCKET_IFNAME": "lo"}


def wanted() -> bool:
    return os.environ.get(ENV) == "1"


def bound_listener(port: int) -> tuple[int, int]:
    """A TCP socket listening on 127.0.0.1:`port` (0: any free port): (its port, its fd).
    The fd is handed over: the store that receives it closes it."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((LOOPBACK, port))
    sock.listen(socket.SOMAXCONN)
    return sock.getsockname()[1], sock.detach()


def serve_stores_on_loopback() -> None:
    """From now on, a TCPStore this process hosts (is_master) listens on 127.0.0.1 only.
    Replaces the class where torch's modules hold it (imported or not yet); a store given
    its own `master_listen_fd` is left as it is."""
    import torch._C._distributed_c10d as c10d
    import torch.distributed as dist

    original = c10d.TCPStore
    if getattr(original, "_baton_loopback", False):
        return

    class LoopbackTCPStore(original):
        _baton_loopback = True

        def __init__(self, host_name, port, world_size=None, is_master=False,
                     timeout=datetime.timedelta(seconds=300), wait_for_workers=True,
                     multi_tenant=False, master_listen_fd=None, use_libuv=True):
            if is_master and master_listen_fd is None:
                port, master_listen_fd = bound_listener(int(port))
                host_name = LOOPBACK
            super().__init__(host_name, port, world_size, is_master, timeout, wait_for_workers,
                             multi_tenant, master_listen_fd, use_libuv)

    LoopbackTCPStore.__name__ = LoopbackTCPStore.__qualname__ = "TCPStore"
    c10d.TCPStore = dist.TCPStore = LoopbackTCPStore
    for name, module in list(sys.modules.items()):
        if name.startswith("torch.distributed") and getattr(module, "TCPStore", None) is original:
            module.TCPStore = LoopbackTCPStore
