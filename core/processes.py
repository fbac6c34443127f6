"""Who a process is, beyond its pid: the host, the pid and the pid's start time.

A pid alone does not name a process for long: pid_max is often 32768, so a dead
owner's pid soon belongs to someone else. The start time (`/proc/PID/stat` field 22,
clock ticks after boot) tells the two apart exactly and, unlike wall-clock times, does
not move when the clock is stepped. A zombie (dead, not yet reaped by its parent)
still has a /proc entry; it counts as gone.
"""
from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional

_PROC = Path("/proc")
_DEAD_STATES = ("Z", "X")


def hostname() -> str:
    return socket.gethostname()


def _stat_fields(pid: int) -> Optional[list[str]]:
    """Fields of /proc/PID/stat after the command name (which may hold spaces and ')')."""
    try:
        text = (_PROC / str(pid) / "stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return text.rsplit(")", 1)[1].split()


def start_ticks(pid: int) -> Optional[int]:
    """The pid's start time in clock ticks after boot; None if it is not running."""
    fields = _stat_fields(pid)
    if fields is None or fields[0] in _DEAD_STATES:
        return None
    return int(fields[19])  # field 22 of the man page; fields[0] is field 3


def send_signal(pid: int, sig: int) -> None:
    """`os.kill` that treats an already exited pid as done."""
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def parent_of(pid: int) -> Optional[int]:
    fields = _stat_fields(pid)
    return int(fields[1]) if fields is not None else None


def _boot_time() -> float:
    for line in (_PROC / "stat").read_text().splitlines():
        if line.startswith("btime "):
            return float(line.split()[1])
    raise OSError("no btime line in /proc/stat")


@dataclass(frozen=True)
class ProcessIdentity:
    host: str
    pid: int
    start_ticks: Optional[int]
    """None where /proc is missing (not Linux): then only the pid is compared."""

    def alive(self) -> bool:
        """Whether this very process still runs. Only meaningful on its own host."""
        if not _PROC.is_dir() or self.start_ticks is None:
            try:
                os.kill(self.pid, 0)
            except ProcessLookupError:
                return False
            except PermissionError:
                return True
            return True
        return start_ticks(self.pid) == self.start_ticks

    def started_at(self) -> Optional[datetime]:
        """Wall-clock start time, for people to read (boot time moves with the clock)."""
        if self.start_ticks is None:
            return None
        seconds = _boot_time() + self.start_ticks / os.sysconf("SC_CLK_TCK")
        return datetime.fromtimestamp(seconds, timezone.utc)

    def token(self) -> str:
        """`pid:ticks`, the form passed to child processes in the environment."""
        return f"{self.pid}:{self.start_ticks if self.start_ticks is not None else ''}"

    @classmethod
    def from_token(cls, token: str) -> "ProcessIdentity":
        pid, _, ticks = token.partition(":")
        return cls(hostname(), int(pid), int(ticks) if ticks else None)


def identity_of(pid: int) -> Optional[ProcessIdentity]:
    """The running process with this pid, or None if there is none."""
    if not _PROC.is_dir():
        return ProcessIdentity(hostname(), pid, None)
    ticks = start_ticks(pid)
    return ProcessIdentity(hostname(), pid, ticks) if ticks is not None else None


def current() -> ProcessIdentity:
    ticks = start_ticks(os.getpid()) if _PROC.is_dir() else None
    return ProcessIdentity(hostname(), os.getpid(), ticks)
