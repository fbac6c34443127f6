"""The peer tier's keeper for the bench: a real `baton ckpt keeper` process on 127.0.0.1,
as on a peer node (its own process, its own GIL), started before the rounds and stopped
after them, whatever happened in between."""
from __future__ import annotations

import signal
import subprocess
import sys

from core.errors import BatonError

STOP_WAIT_S = 10.0


class KeeperProcess:
    def __init__(self):
        self.process = subprocess.Popen(
            [sys.executable, "-m", "baton.cli", "ckpt", "keeper", "--host", "127.0.0.1"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            text=True)
        line = self.process.stdout.readline()  # blocks until it listens (or dies)
        if "listening on" not in line:
            rest = self.stop()
            raise BatonError(f"bench ckpt --tiers: the peer keeper did not start: "
                             f"{(line + rest).strip()}")
        self.endpoint = line.split("listening on ")[1].split()[0]

    @property
    def pid(self) -> int:
        return self.process.pid

    def stop(self) -> str:
        """Interrupt it (it drops every copy it holds), kill it if it does not go; returns
        whatever else it printed."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        rest = self.process.stdout.read()
        self.process.stdout.close()
        return rest
