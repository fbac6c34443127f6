"""Test helper: a real `baton ckpt keeper` process, started and stopped by the test."""
from __future__ import annotations

import subprocess
import sys

from tests.conftest import REPO


class KeeperProcess:
    def __init__(self, *args: str):
        self.process = subprocess.Popen(
            [sys.executable, "-m", "baton.cli", "ckpt", "keeper", *args], cwd=REPO,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        line = self.process.stdout.readline()  # blocks until it listens (or dies)
        if "listening on" not in line:
            self.stop()
            raise AssertionError(f"keeper did not start: {line}{self.process.stdout.read()}")
        self.endpoint = line.split("listening on ")[1].split()[0]

    def stop(self) -> None:
        """Kill it (a node loss): every copy it held is gone."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=10)
        self.process.stdout.close()

    @property
    def alive(self) -> bool:
        return self.process.poll() is None
