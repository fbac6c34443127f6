"""The peer keeper: holds other nodes' checkpoint copies in its own memory, over TCP.

A node restart wipes that node's memory tier; its shards survive here, on another node,
until the keeper itself goes. Files arrive one by one and a checkpoint is listed only
after its `commit`, which the sender issues after the manifest: a copy cut short by a
crash is never offered for restore. The keeper checks nothing about the bytes (the
restoring side verifies every checksum before loading), so it needs no torch.

Binds 127.0.0.1 unless told otherwise; with `BATON_KEEPER_TOKEN` set, every request must
carry the same token (compared in constant time).
"""
from __future__ import annotations

import hmac
import logging
import os
import socketserver
import threading
from dataclasses import dataclass, field

from ckpt.layout import position_of
from ckpt.tiers import wire

log = logging.getLogger(__name__)
TOKEN_ENV = "BATON_KEEPER_TOKEN"


@dataclass
class Held:
    files: dict[str, bytes] = field(default_factory=dict)
    committed: bool = False

    @property
    def bytes(self) -> int:
        return sum(len(b) for b in self.files.values())


class Store:
    """scope ("<run key>/<stage>") -> checkpoint name -> files."""

    def __init__(self, max_bytes: int):
        self.max_bytes, self.lock = max_bytes, threading.Lock()
        self.scopes: dict[str, dict[str, Held]] = {}

    def held_bytes(self) -> int:
        return sum(h.bytes for names in self.scopes.values() for h in names.values())

    def put(self, scope: str, name: str, rel: str, data: bytes) -> dict:
        with self.lock:
            held = self.scopes.setdefault(scope, {}).setdefault(name, Held())
            if held.committed:
                held.files.clear()  # the same step sent again (a resumed run): replace it
                held.committed = False
            total = self.held_bytes() - len(held.files.get(rel, b"")) + len(data)
            if self.max_bytes and total > self.max_bytes:
                return {"error": f"keeper full: {rel} of {name} needs {len(data)} bytes and "
                                 f"{self.held_bytes()} of {self.max_bytes} are held "
                                 "(start the keeper with a larger --max-bytes)"}
            held.files[rel] = data
        return {"ok": True}

    def commit(self, scope: str, name: str, keep: int) -> dict:
        with self.lock:
            names = self.scopes.get(scope, {})
            if name not in names:
                return {"error": f"nothing received for {name}"}
            names[name].committed = True
            done = sorted((n for n, h in names.items() if h.committed), key=position_of)
            dropped = done[:-keep] if keep > 0 else []
            for old in dropped:
                del names[old]
        return {"ok": True, "dropped": dropped}

    def listing(self, scope: str) -> dict:
        with self.lock:
            names = self.scopes.get(scope, {})
            done = sorted((n for n, h in names.items() if h.committed), key=position_of)
            return {"ok": True, "names": done,
                    "files": {n: {r: len(b) for r, b in names[n].files.items()} for n in done}}

    def get(self, scope: str, name: str, rel: str) -> tuple[dict, bytes]:
        with self.lock:
            held = self.scopes.get(scope, {}).get(name)
            if held is None or not held.committed or rel not in held.files:
                return {"error": f"no committed {name}/{rel} here"}, b""
            return {"ok": True}, held.files[rel]


class _Handler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        server: KeeperServer = self.server  # type: ignore[assignment]
        wire.no_delay(self.request)
        while True:
            try:
                header, payload = wire.receive(self.request)
            except (wire.WireError, OSError):
                return
            reply, data = server.answer(header, payload)
            try:
                wire.send(self.request, reply, data)
            except OSError:
                return


class KeeperServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, host: str, port: int, max_bytes: int, token: str | None):
        super().__init__((host, port), _Handler)
        self.store, self.token = Store(max_bytes), token

    def answer(self, header: dict, payload: bytes) -> tuple[dict, bytes]:
        if self.token and not hmac.compare_digest(str(header.get("token", "")), self.token):
            return {"error": f"refused: wrong or missing token ({TOKEN_ENV})"}, b""
        op, scope, name = header.get("op"), str(header.get("scope", "")), header.get("name")
        if op == "ping":
            return {"ok": True, "pid": os.getpid(), "held_bytes": self.store.held_bytes(),
                    "max_bytes": self.store.max_bytes}, b""
        if op == "put":
            return self.store.put(scope, name, header["rel"], payload), b""
        if op == "commit":
            return self.store.commit(scope, name, int(header.get("keep", 0))), b""
        if op == "list":
            return self.store.listing(scope), b""
        if op == "get":
            return self.store.get(scope, name, header["rel"])
        return {"error": f"unknown request {op!r}"}, b""


def serve(host: str = "127.0.0.1", port: int = 0, max_bytes: int = 0,
          ready=None) -> None:
    """Run a keeper until interrupted. `ready(host, port)` is called once it listens."""
    server = KeeperServer(host, port, max_bytes, os.environ.get(TOKEN_ENV) or None)
    bound_host, bound_port = server.server_address[:2]
    if ready is not None:
        ready(bound_host, bound_port)
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        server.server_close()
