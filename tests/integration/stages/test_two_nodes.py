"""Two "nodes" on this machine: two `baton stage` launchers meeting through torchrun's c10d
rendezvous on 127.0.0.1 (world size 2, one rank per node), as on a real cluster.

With the peer tier on, one node's processes are killed mid-run; both launchers then
restart with `resume=latest`, restore the newest copy from the peer keeper (the fastest
tier that holds it), and end bit for bit where one launcher with two ranks, never
interrupted, ends: so two launchers also train exactly what one does.
"""
from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from tests.conftest import metrics, run_baton
from tests.keeper_process import KeeperProcess
from tests.process_tree import kill_tree, start_baton, wait_until

pytestmark = pytest.mark.slow
STEPS = 6
COMMON = [f"stage.max_steps={STEPS}", "stage.eval_every=2", "parallel.world_size=2"]
EVERY_4 = "stage.save_every=4"
FINAL = f"cpt/checkpoints/step-{STEPS:06d}"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _start_nodes(tmp: Path, run_dir: Path, tag: str, *extra: str):
    endpoint = f"127.0.0.1:{_free_port()}"
    return [start_baton(tmp / f"{tag}-node{k}.log", "stage", "cpt", f"run.dir={run_dir}",
                        *COMMON, "parallel.nodes=2", f"parallel.node_rank={k}",
                        f"parallel.rdzv_endpoint={endpoint}", *extra) for k in (0, 1)]


def _finish(nodes, timeout: float = 300) -> list[int]:
    try:
        return [node.wait(timeout=timeout) for node in nodes]
    finally:
        for node in nodes:
            if node.poll() is None:
                kill_tree(node)


def _saved(logs: list[Path], nodes, name: str) -> bool:
    if any(node.poll() is not None for node in nodes):
        raise AssertionError("a node's launcher exited early:\n"
                             + "\n".join(log.read_text()[-2000:] for log in logs))
    return any(f"checkpoints/{name} (" in log.read_text() for log in logs)


@pytest.fixture(scope="module")
def straight(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("one-launcher")
    run_baton("stage", "cpt", f"run.dir={run_dir}", *COMMON, EVERY_4, check=True)
    return run_dir


def test_a_node_killed_mid_run_resumes_from_the_peer_tier(straight, tmp_path):
    keeper = KeeperProcess()
    run_dir = tmp_path / "run"
    # Every step reaches the shared run directory and the keeper: for the same checkpoint,
    # restore must prefer the keeper's copy (memory, over TCP) to the shared file system's.
    tiers = ["stage.save_every=1", "stage.keep_last=2", "ckpt.tiers.peer.every=1",
             f"ckpt.tiers.peer.endpoint={keeper.endpoint}"]
    try:
        nodes = _start_nodes(tmp_path, run_dir, "first", *tiers)
        logs = [tmp_path / f"first-node{k}.log" for k in (0, 1)]
        # The peer copy of step 3 is sent before its save is reported committed.
        wait_until(lambda: _saved(logs, nodes, "step-000003"), timeout=300,
                   what="the save of step 3")
        kill_tree(nodes[1])  # node 1's launcher, torchrun and worker: the node is lost
        assert nodes[0].wait(timeout=180) != 0  # its peer is gone: node 0's launch fails
        survivor = logs[0].read_text()
        assert "a rank on another node stopped answering" in survivor
        assert "an infrastructure failure" in survivor and "Traceback" not in survivor
        held = json.loads(run_baton("ckpt", "tiers", "cpt", f"run.dir={run_dir}", *COMMON,
                                    *tiers, "--json", check=True).stdout)["copies"]
        newest_peer = max(c["name"] for c in held if c["tier"] == "peer")
        assert newest_peer >= "step-000003"

        assert _finish(_start_nodes(tmp_path, run_dir, "again", *tiers, "resume=latest")) == [0, 0]
        # Each node's launcher kept its own files in the shared stage directory.
        assert {p.name for p in (run_dir / "cpt").iterdir()} >= {
            "launch.json", "launch-node-1.json", "stage.lock", "stage-node-1.lock"}
        for k, record in enumerate(["restore.json", "restore-node-1.json"]):
            restored = json.loads((run_dir / "cpt" / record).read_text())
            assert (restored["tier"], restored["name"]) == ("peer", newest_peer), f"node {k}"
        diff = run_baton("ckpt", "diff", str(straight / FINAL), str(run_dir / FINAL))
        assert diff.returncode == 0 and "IDENTICAL" in diff.stdout, diff.stdout + diff.stderr
        a, b = metrics(straight, "cpt"), metrics(run_dir, "cpt")
        assert all(a[s]["loss"] == b[s]["loss"] for s in range(int(newest_peer[5:]) + 1, STEPS + 1))
    finally:
        keeper.stop()
