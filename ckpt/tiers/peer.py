"""The client side of the peer tier: send a committed checkpoint to a keeper, list and
fetch what it holds. Every failure is a `PeerUnavailable` naming the endpoint."""
from __future__ import annotations

import contextlib
import os
import socket
from pathlib import Path

from ckpt.layout import MANIFEST
from ckpt.tiers import wire
from ckpt.tiers.keeper import TOKEN_ENV
from ckpt.tiers.shipment import Shipment, shipment_of


class PeerUnavailable(OSError):
    def __init__(self, endpoint: str, why: str):
        super().__init__(f"peer keeper {endpoint}: {why}")
        self.endpoint, self.why = endpoint, why


class PeerClient:
    def __init__(self, endpoint: str, timeout_s: float = 30.0):
        self.endpoint, self.timeout_s = endpoint, timeout_s
        host, _, port = endpoint.rpartition(":")
        self.address = (host, int(port))
        self._sock: socket.socket | None = None

    def __enter__(self) -> "PeerClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def _connected(self) -> socket.socket:
        if self._sock is None:
            self._sock = wire.no_delay(socket.create_connection(self.address,
                                                                timeout=self.timeout_s))
        return self._sock

    @staticmethod
    def _signed(header: dict) -> dict:
        token = os.environ.get(TOKEN_ENV)
        return {**header, **({"token": token} if token else {})}

    @contextlib.contextmanager
    def _exchange(self):
        """The connection for one request; any socket failure (refused, reset, timed out,
        closed mid-message) becomes a PeerUnavailable naming the endpoint."""
        try:
            yield self._connected()
        except PeerUnavailable:
            raise
        except OSError as exc:
            self.close()
            raise PeerUnavailable(self.endpoint, exc.strerror or str(exc)
                                  or type(exc).__name__) from None

    def _answered(self, reply: dict) -> dict:
        if "error" in reply:
            raise PeerUnavailable(self.endpoint, reply["error"])
        return reply

    def request(self, header: dict, payload: bytes = b"") -> tuple[dict, bytes]:
        with self._exchange() as sock:
            wire.send(sock, self._signed(header), payload)
            reply, data = wire.receive(sock)
        return self._answered(reply), data

    def _put_file(self, header: dict, path: Path) -> None:
        with self._exchange() as sock:
            wire.send_file(sock, self._signed(header), path)
            reply, _ = wire.receive(sock)
        self._answered(reply)

    def send_checkpoint(self, scope: str, source: Path | Shipment, keep: int) -> list[str]:
        """Every file, the manifest last, then commit. Returns the copies the keeper dropped."""
        shipment = source if isinstance(source, Shipment) else shipment_of(source)
        name = shipment.name
        for rel, path in shipment.files:
            self._put_file({"op": "put", "scope": scope, "name": name, "rel": rel}, path)
        self.request({"op": "put", "scope": scope, "name": name, "rel": MANIFEST}, shipment.manifest)
        reply, _ = self.request({"op": "commit", "scope": scope, "name": name, "keep": keep})
        return reply.get("dropped", [])

    def committed(self, scope: str) -> dict[str, dict[str, int]]:
        """name -> {rel: size} of every committed copy, oldest first."""
        reply, _ = self.request({"op": "list", "scope": scope})
        return {name: reply["files"][name] for name in reply["names"]}

    def fetch(self, scope: str, name: str, rels: list[str], into: Path) -> None:
        """Each file streamed to disk as it arrives (restore verifies them afterwards)."""
        for rel in rels:
            path = into / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            with self._exchange() as sock:
                wire.send(sock, self._signed({"op": "get", "scope": scope, "name": name,
                                              "rel": rel}))
                reply = wire.receive_header(sock)
                if "error" not in reply:
                    with open(path, "wb") as handle:
                        wire.receive_into(sock, reply["size"], handle)
                else:
                    wire.receive_into(sock, reply.get("size", 0), _Discard())
            self._answered(reply)

    def ping(self) -> dict:
        return self.request({"op": "ping"})[0]


class _Discard:
    def write(self, data) -> None:
        pass
