"""`python -m core.server_guard CMD...`: run a server (CMD) so that nothing it starts
outlives the command that started the guard.

A server such as `mlflow server` starts its own children (uvicorn, job runners), and a
signal to the server alone orphans them: they are re-parented to init and keep the port
and the store. The guard closes every way out:

- it is a child subreaper (PR_SET_CHILD_SUBREAPER): a descendant orphaned by the death of
  its parent is re-parented to the guard, so every process the server ever started is
  still found by walking the guard's descendants;
- it dies with its own parent (PR_SET_PDEATHSIG, SIGTERM), so a SIGKILLed owner still
  takes the server down, and it checks that the parent was not gone already;
- on SIGTERM, SIGINT or SIGHUP, and when the server exits, it sends SIGTERM to every
  descendant, then SIGKILL to those still there after GRACE_SECONDS.

Only the pids found below the guard are signalled: never a name, never a group it did not
create. Linux only (prctl); elsewhere the server runs unguarded.
"""
from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from core.processes import parent_of, send_signal, start_ticks

PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER = 1, 36
GRACE_SECONDS = 3.0
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def guarded(command: list[str]) -> list[str]:
    """The command line that runs `command` under the guard."""
    return [sys.executable, "-m", "core.server_guard", *command]


def descendants(pid: int) -> list[int]:
    """Every live process below `pid` (from /proc's parent links), children first."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and start_ticks(int(entry.name)) is not None:  # not a zombie
            parent = parent_of(int(entry.name))
            if parent is not None:
                children.setdefault(parent, []).append(int(entry.name))
    found, queue = [], list(children.get(pid, []))
    while queue:
        child = queue.pop(0)
        found.append(child)
        queue.extend(children.get(child, []))
    return found


def stop_all(grace: float = GRACE_SECONDS) -> None:
    """SIGTERM to every descendant of this process, then SIGKILL to the rest."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 1.0)):
        for pid in descendants(os.getpid()):
            send_signal(pid, sig)
        deadline = time.monotonic() + wait
        while descendants(os.getpid()) and time.monotonic() < deadline:
            _reap()
            time.sleep(0.05)
        _reap()


def _reap() -> None:
    """Collect exited children (orphans re-parented to this subreaper included)."""
    try:
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass
    except ChildProcessError:
        pass


def _tie_to_parent() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def main(command: list[str]) -> int:
    parent = os.getppid()
    stopping: list[int] = []
    for sig in STOP_SIGNALS:
        signal.signal(sig, lambda number, _frame: stopping.append(number))
    if sys.platform.startswith("linux"):
        _tie_to_parent()
    if os.getppid() != parent:  # the owner died before the tie was made
        return 1
    server = subprocess.Popen(command)
    returncode = None
    while returncode is None and not stopping:
        try:
            returncode = server.wait(timeout=0.2)
        except subprocess.TimeoutExpired:
            continue
    stop_all()
    return 0 if stopping else returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
