"""Workers forked by the fork server (stages.fork_server) are the workers a fresh
interpreter would have started: the same checkpoint bytes, one process or two ranks; a
SIGTERM to the launcher still preempts with a save; SIGKILL of the launcher ends the
warm worker at once, as it ends a cold one."""
from __future__ import annotations

import json
import os
import signal

import pytest

from ckpt.content_digest import content_digest_of
from stages.fork_server import ENV
from tests.conftest import run_baton
from tests.process_tree import kill_tree, metrics_lines, start_baton, wait_until

SHORT = ("stage.max_steps=2", "stage.save_every=2", "stage.eval_every=1000")
LONG = ("stage.max_steps=400", "stage.save_every=1000", "stage.eval_every=1000")


def _forks_of(server, launcher_pid: int) -> list[dict]:
    """The fork server's records of the workers launched under `launcher_pid`."""
    return [f for f in server.forks() if (f["chain"] or "").startswith(f"{launcher_pid}:")
            or f",{launcher_pid}:" in (f["chain"] or "")]


@pytest.mark.parametrize("parallel", ["single", "dp2_zero2"])
def test_a_warm_launch_saves_the_bytes_a_cold_one_does(tmp_path, fork_server, parallel):
    before = len(fork_server.forks())
    warm = run_baton("stage", "cpt", f"run.dir={tmp_path / 'warm'}", f"parallel={parallel}",
                     *SHORT, check=True)
    forked = fork_server.forks()[before:]
    assert [f["module"] for f in forked] == ["stages.worker"], forked
    assert forked[0]["nproc"] == (1 if parallel == "single" else 2)
    assert "starts its workers cold" not in warm.stderr
    cold = run_baton("stage", "cpt", f"run.dir={tmp_path / 'cold'}", f"parallel={parallel}",
                     *SHORT, check=True, env={ENV: ""})
    assert len(fork_server.forks()) == before + 1, "the cold launch went to the fork server"
    step = "cpt/checkpoints/step-000002"
    assert content_digest_of(tmp_path / "warm" / step) == content_digest_of(tmp_path / "cold" / step)
    assert cold.stdout.splitlines()[-1].replace("cold", "warm") == warm.stdout.splitlines()[-1]


def test_sigterm_to_the_launcher_preempts_a_warm_worker_with_a_save(tmp_path, fork_server):
    proc = start_baton(tmp_path / "log", "stage", "cpt", f"run.dir={tmp_path}", *LONG, warm=True)
    try:
        wait_until(lambda: metrics_lines(tmp_path / "cpt" / "metrics.jsonl") > 0, 120,
                   what="the first step")
        assert _forks_of(fork_server, proc.pid), "the launch did not start warm"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 0, (tmp_path / "log").read_text()
    finally:
        kill_tree(proc)
    result = json.loads((tmp_path / "cpt" / "result.json").read_text())
    assert result["status"] == "preempted"
    assert result["checkpoints"], "a preempted stage saves where it stopped"


def test_sigkill_of_the_launcher_ends_its_warm_worker_at_once(tmp_path, fork_server):
    proc = start_baton(tmp_path / "log", "stage", "cpt", f"run.dir={tmp_path}", *LONG, warm=True)
    try:
        wait_until(lambda: metrics_lines(tmp_path / "cpt" / "metrics.jsonl") > 0, 120,
                   what="the first step")
        (worker,) = [f["pid"] for f in _forks_of(fork_server, proc.pid)]
        assert os.path.exists(f"/proc/{worker}")
        os.kill(proc.pid, signal.SIGKILL)
        wait_until(lambda: not _running(worker), 5, interval=0.005, what="the warm worker to exit")
    finally:
        kill_tree(proc)


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
