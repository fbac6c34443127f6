"""`baton ui` stops everything it started: the MLflow server and every process MLflow
started (uvicorn and its worker), whether `baton ui` itself is stopped with SIGTERM,
SIGINT or SIGHUP (a service manager, `kill`, Ctrl-C, a closed terminal) or SIGKILLed,
the signal sent to its process alone. MLflow's job runner
(huey consumers) is not started at all."""
from __future__ import annotations

import os
import signal
import socket
import urllib.request

import pytest

from tests.process_tree import command_line, descendants, kill_tree, start_baton, wait_until

STOP_WITHIN_S = 5


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _serving(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=2)
        return True
    except OSError:
        return False


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGKILL],
                         ids=["SIGTERM", "SIGINT", "SIGHUP", "SIGKILL"])
def test_no_process_of_baton_ui_outlives_it(tmp_path, sig):
    port = _free_port()
    log = tmp_path / "ui.log"
    proc = start_baton(log, "ui", "--port", str(port), f"run.dir={tmp_path}")
    tree = []
    try:
        wait_until(lambda: _serving(f"http://127.0.0.1:{port}/health") or proc.poll() is not None,
                   90, interval=0.2, what="the MLflow UI to answer")
        assert proc.poll() is None, log.read_text()
        tree = descendants(proc.pid)
        commands = [command_line(p.pid) for p in tree]
        assert any("mlflow" in c and "server" in c for c in commands), commands
        assert not any("huey" in c for c in commands), commands  # no job runner
        os.kill(proc.pid, sig)  # the process only, not its group
        proc.wait(timeout=STOP_WITHIN_S + 5)
        alive = lambda: [f"{p.pid}: {command_line(p.pid)}" for p in tree if p.alive()]  # noqa: E731
        wait_until(lambda: not alive(), STOP_WITHIN_S, interval=0.1,
                   what=f"every process of baton ui to stop after {sig.name}")
        assert not _serving(f"http://127.0.0.1:{port}/health")
    finally:
        kill_tree(proc, tree)
