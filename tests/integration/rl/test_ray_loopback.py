"""With rl.ray.address unset the stage starts its own Ray instance: every socket Ray (and
the launcher, its driver) listens on is bound to 127.0.0.1 (read from `ss` while the stage runs, for the processes of the
stage's own tree), no dashboard is started, and nothing of it is left afterwards."""
from __future__ import annotations

import subprocess

import pytest

from tests.process_tree import command_line, descendants, kill_tree, start_baton, wait_until

LOOPBACK = ("127.0.0.1:", "[::ffff:127.0.0.1]:")


def listening(pids: set[int]) -> list[tuple[str, int]]:
    """(local address, pid) of every TCP/UDP socket in LISTEN state owned by one of `pids`."""
    out = subprocess.run(["ss", "-H", "-lntup"], capture_output=True, text=True, check=True).stdout
    found = []
    for line in out.splitlines():
        fields = line.split()
        for pid in pids:
            if f"pid={pid}," in line:
                found.append((fields[4], pid))
    return found


@pytest.mark.slow
def test_the_embedded_ray_instance_listens_on_loopback_only_and_is_stopped(tmp_path):
    proc = start_baton(tmp_path / "log", "stage", "rl", f"run.dir={tmp_path / 'run'}",
                       "stage.max_steps=40", "stage.save_every=40", "stage.global_batch=4",
                       "stage.micro_batch=4", "stage.group_size=2", "stage.eval_every=40",
                       "stage.eval_samples=2", "stage.eval_at_start=false")
    seen = []
    try:
        # The first journal segment exists only once every role has served a step.
        wait_until(lambda: (tmp_path / "run" / "rl" / "journal" / "step-000001").is_dir(), 240,
                   what="the first RL step")
        seen = descendants(proc.pid)
        names = {command_line(p.pid).split(" ")[0] for p in seen}
        assert any("gcs_server" in n for n in names) and any("raylet" in n for n in names), names
        # Ray keeps a head process named dashboard.py even when the dashboard is off; off
        # means it runs minimal, without the web frontend.
        heads = [command_line(p.pid) for p in seen if "dashboard/dashboard.py" in command_line(p.pid)]
        assert all("--minimal" in h and "--disable-frontend" in h for h in heads), heads
        # The Ray instance and the launcher (a Ray driver). torchrun's rendezvous store in
        # the trainer's agent is not Ray's, and binds as torch.distributed decides.
        trainer = ("stages.lifeline", "stages.worker")
        ray_side = {p.pid for p in seen if not any(t in command_line(p.pid) for t in trainer)}
        sockets = listening(ray_side | {proc.pid})
        assert sockets, "found no listening socket of the Ray instance"
        exposed = [(addr, command_line(pid)[:60]) for addr, pid in sockets if not addr.startswith(LOOPBACK)]
        assert not exposed, exposed
        assert proc.wait(timeout=300) == 0, (tmp_path / "log").read_text()[-3000:]
        # Ray's processes are stopped by the stage (ray.shutdown), not by this test.
        wait_until(lambda: not [p for p in seen if p.alive()], 30,
                   what="the stage's Ray processes to exit")
    except BaseException:
        kill_tree(proc, seen)
        raise
