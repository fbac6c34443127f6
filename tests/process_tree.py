"""Test helpers: a background `baton` process, the processes it started, and waiting.

The process tree is read from /proc (every pid's parent), not from psutil, which baton
does not depend on. torchrun puts its workers in sessions of their own, so the tree,
not the process group, is what finds them.
"""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from core import processes
from core.processes import ProcessIdentity
from stages.fork_server import ENV as FORK_SERVER_ENV
from tests.conftest import REPO, environment


def start_baton(log: Path, *args: str, warm: bool = False,
                env: dict | None = None) -> subprocess.Popen:
    """`baton ARGS` in the background, its output to `log` (a pipe nobody reads would
    block it). Its launches start cold unless `warm`: a warm launch's workers are forked by
    the fork server (stages.fork_server), outside the launcher's process tree, which is
    where the tests that start baton in the background look for them. `env`: changes, as
    tests.conftest.environment takes them."""
    handle = open(log, "w")
    env = environment(env)
    if not warm:
        env.pop(FORK_SERVER_ENV, None)
    try:
        return subprocess.Popen([sys.executable, "-m", "baton.cli", *args], cwd=REPO,
                                stdout=handle, stderr=subprocess.STDOUT, text=True, env=env)
    finally:
        handle.close()


def descendants(pid: int) -> list[ProcessIdentity]:
    """Every live process below `pid`, children first."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            parent = processes.parent_of(int(entry.name))
            if parent is not None:
                parents.setdefault(parent, []).append(int(entry.name))
    found, queue = [], list(parents.get(pid, []))
    while queue:
        child = queue.pop(0)
        identity = processes.identity_of(child)
        if identity is not None:
            found.append(identity)
        queue.extend(parents.get(child, []))
    return found


def launch_processes(pid: int, server) -> tuple[list[ProcessIdentity], list[ProcessIdentity]]:
    """(every live process of `pid`'s launches, their workers): its process tree, plus the
    workers the fork server `server` forked for it (outside that tree, stages.zygote) and
    their own children."""
    tree = descendants(pid)
    ours = {pid} | {p.pid for p in tree}
    workers = [p for p in tree if _is_cold_worker(command_line(p.pid))]
    for record in server.forks():
        chain = {int(token.split(":")[0]) for token in (record["chain"] or "").split(",") if token}
        identity = processes.identity_of(record["pid"]) if chain & ours else None
        if identity is not None:
            workers.append(identity)
            tree += [identity, *descendants(record["pid"])]
    return tree, workers


def _is_cold_worker(command: str) -> bool:
    # The launch agent's command names the worker module too; a cold worker is exec'd.
    return "stages.worker" in command and "stages.launch_agent" not in command


def command_line(pid: int) -> str:
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode()
    except (FileNotFoundError, ProcessLookupError):
        return ""


def wait_until(predicate: Callable[[], object], timeout: float, interval: float = 0.05,
               what: str = "condition"):
    """Poll until `predicate()` is truthy; return its value, or fail after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def metrics_lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.is_file() else 0


def kill_tree(proc: subprocess.Popen, known: list[ProcessIdentity] = ()) -> None:
    """Clean-up after a failed test: SIGKILL what is left of a launch (`known`: processes
    seen in its tree earlier, which may have been re-parented since), workers first."""
    for identity in [*reversed(descendants(proc.pid)), *known]:
        if identity.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(identity.pid, signal.SIGKILL)
    if proc.poll() is None:
        proc.kill()
    proc.wait()


LOOPBACK_HOSTS = ("127.0.0.1", "::1", "::ffff:127.0.0.1")


def listeners(pids) -> list[tuple[str, int, str]]:
    """(address:port, pid, command line) of every listening TCP socket and every bound UDP
    socket owned by one of `pids` (psutil, read while they run)."""
    import psutil

    found = []
    for pid in pids:
        try:
            sockets = psutil.Process(pid).net_connections(kind="inet")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        for sock in sockets:
            udp = sock.type == 2  # SOCK_DGRAM: bound, no peer
            if (sock.status == psutil.CONN_LISTEN or (udp and not sock.raddr)) and sock.laddr:
                found.append((f"{sock.laddr.ip}:{sock.laddr.port}", pid, command_line(pid)[:120]))
    return found


def exposed(pids) -> list[tuple[str, int, str]]:
    """The listeners of `pids` that are not bound to a loopback address."""
    return [entry for entry in listeners(pids) if entry[0].rsplit(":", 1)[0] not in LOOPBACK_HOSTS]
