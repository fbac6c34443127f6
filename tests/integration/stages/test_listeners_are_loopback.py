"""A single-node stage listens on loopback only: every listening TCP socket and bound UDP
socket of the launcher's whole process tree (torchrun's agent and its rendezvous stores,
the workers, gloo, the saver processes and their own group) is on 127.0.0.1, read with
psutil while two workers train and save. The check
itself is shown to catch the exposure it looks for: plain `torchrun --standalone` hosts
its stores on every interface. (The RL stage's Ray roles: tests/integration/rl/
test_ray_loopback.py.)"""
from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import REPO
from tests.process_tree import (descendants, exposed, kill_tree, listeners, metrics_lines,
                                start_baton, wait_until)

pytestmark = pytest.mark.slow


def test_a_single_node_stage_with_two_workers_listens_on_loopback_only(tmp_path):
    metrics = tmp_path / "cpt" / "metrics.jsonl"
    proc = start_baton(tmp_path / "log", "stage", "cpt", f"run.dir={tmp_path}",
                       "parallel.world_size=2", "stage.max_steps=400", "stage.save_every=2",
                       "stage.eval_every=1000", "ckpt.saver=process")
    tree = []
    try:
        saved = tmp_path / "cpt" / "checkpoints" / "latest"
        wait_until(lambda: (metrics_lines(metrics) >= 3 and saved.exists()) or proc.poll() is not None,
                   240, what="three training steps and a committed save")
        assert proc.poll() is None, (tmp_path / "log").read_text()[-3000:]
        tree = descendants(proc.pid)
        pids = {proc.pid, *(p.pid for p in tree)}
        found = listeners(pids)
        assert found, "no listening socket found: the check saw nothing"
        assert not exposed(pids), f"listening beyond loopback: {exposed(pids)}"
    finally:
        kill_tree(proc, tree)


SLEEPER = "import time; time.sleep(60)"


def test_the_check_catches_plain_torchrun_standalone(tmp_path):
    """Without baton's lifeline, torchrun's agent hosts its rendezvous store on every
    interface: the same check must name it."""
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone",
                             "--nproc-per-node=1", str(script)], cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    tree = []
    try:
        def agent_exposed():
            return proc.poll() is not None or exposed({proc.pid})
        wait_until(agent_exposed, 60, interval=0.2, what="torchrun's agent to listen")
        assert proc.poll() is None
        found = exposed({proc.pid})
        assert any(address.startswith(("0.0.0.0:", ":::", "::")) for address, _, _ in found), found
        tree = descendants(proc.pid)
    finally:
        proc.terminate()
        kill_tree(proc, tree)
