"""A guardian for the helper processes that a library starts on baton's behalf.

`stages.lifeline` makes torchrun and the workers die with their launcher, because baton
starts them. Some processes are started by a library with its own `Popen` (Prefect's
temporary API server, when no PREFECT_API_URL is set), so nothing of baton's runs in
them. The guardian covers those: a small process that holds the read end of a pipe
from its owner. The owner writes the identity (pid and start time) of each process it
wants covered; when the pipe reaches end-of-file, which happens however the owner dies
(SIGKILL included), the guardian stops the listed processes that are still the same
processes (SIGTERM, then SIGKILL after a grace period) and exits.

    python -m core.guardian        # started by Guardian.start(); reads pids from stdin
"""
from __future__ import annotations

import signal
import subprocess
import sys
import time

from core import processes

GRACE_S = 2.0


class Guardian:
    """Owner's side: `start()` once, then `cover(pid)` for each process to stop with us.
    There is no release: the pipe closes when the owner exits, and by then a clean owner
    has stopped what it covered, so the guardian finds nothing left to stop."""

    def __init__(self):
        self._process: subprocess.Popen | None = None

    def start(self) -> "Guardian":
        if self._process is None:
            # Its own session: a signal to the owner's process group must not stop it
            # before it has done its job.
            self._process = subprocess.Popen([sys.executable, "-m", "core.guardian"],
                                             stdin=subprocess.PIPE, start_new_session=True)
        return self

    def cover(self, pid: int) -> None:
        identity = processes.identity_of(pid)
        if self._process is None or identity is None:
            return
        self._process.stdin.write(f"{identity.pid} {identity.start_ticks}\n".encode())
        self._process.stdin.flush()


def _stop(covered: list[tuple[int, str]]) -> None:
    alive = [pid for pid, ticks in covered if _same(pid, ticks)]
    for pid in alive:
        processes.send_signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + GRACE_S
    while alive and time.monotonic() < deadline:
        time.sleep(0.1)
        alive = [pid for pid in alive if processes.start_ticks(pid) is not None]
    for pid in alive:
        processes.send_signal(pid, signal.SIGKILL)


def _same(pid: int, ticks: str) -> bool:
    now = processes.start_ticks(pid)
    return now is not None and str(now) == ticks


def main() -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C in the terminal is the owner's
    covered = []
    for line in sys.stdin:
        pid, ticks = line.split()
        covered.append((int(pid), ticks))
    _stop(covered)
    return 0


if __name__ == "__main__":
    sys.exit(main())
