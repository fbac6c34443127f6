"""With rl.ray.address unset the stage starts its own Ray instance: every socket of the
stage's process tree (Ray, the launcher as its driver, the trainer worker and the
store its rank 0 hosts) listens on 127.0.0.1 only (read with psutil while the stage runs), no dashboard
is started, and nothing of it is left afterwards."""
from __future__ import annotations

import pytest

from tests.process_tree import (command_line, descendants, exposed, kill_tree, listeners,
                                start_baton, wait_until)

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
        # The Ray instance, the launcher (a Ray driver) and the trainer (the worker, whose
        # rank 0 hosts the group's store): the whole tree, TCP and UDP.
        pids = {proc.pid, *(p.pid for p in seen)}
        trainer = [p.pid for p in seen if "stages.worker" in command_line(p.pid)]
        assert trainer and any(pid in trainer for _, pid, _ in listeners(pids)), \
            "found no listening socket of the trainer (its rank 0 hosts the group's store)"
        assert any("raylet" in command for _, _, command in listeners(pids)), \
            "found no listening socket of the Ray instance"
        assert not exposed(pids), f"listening beyond loopback: {exposed(pids)}"
        assert proc.wait(timeout=300) == 0, (tmp_path / "log").read_text()[-3000:]
        # Ray's processes are stopped by the stage (ray.shutdown), not by this test.
        wait_until(lambda: not [p for p in seen if p.alive()], 30,
                   what="the stage's Ray processes to exit")
    except BaseException:
        kill_tree(proc, seen)
        raise
