"""SIGKILL of `baton run` leaves nothing running: not torchrun, not a worker, not Prefect's
temporary API server (which Prefect itself would stop only at a clean exit); and the
next look at the lineage store marks the pipeline and stage runs `crashed`."""
from __future__ import annotations

import json
import signal
import time

import pytest

from tests.conftest import EPHEMERAL_PREFECT, run_baton
from tests.process_tree import command_line, descendants, kill_tree, start_baton, wait_until

pytestmark = pytest.mark.slow


def test_sigkill_of_baton_run_stops_every_process_it_started_and_marks_its_runs_crashed(tmp_path):
    launcher = start_baton(tmp_path / "run.log", "run", "--stages", "cpt", f"run.dir={tmp_path}",
                           "stage.max_steps=40", "stage.save_every=1", env=EPHEMERAL_PREFECT)
    tree = []
    try:
        metrics = tmp_path / "pipeline-0001" / "cpt" / "metrics.jsonl"
        wait_until(metrics.is_file, 300, interval=0.2, what="the first training step")
        tree = descendants(launcher.pid)
        commands = [command_line(p.pid) for p in tree]
        assert any("uvicorn" in c for c in commands), f"no Prefect API server in {commands}"
        assert any("stages.worker" in c for c in commands), f"no worker in {commands}"
        launcher.send_signal(signal.SIGKILL)
        launcher.wait()
        killed_at = time.monotonic()
        wait_until(lambda: not any(p.alive() for p in tree), 5, interval=0.1,
                   what=f"every process under baton run to stop ({commands})")
        assert time.monotonic() - killed_at <= 5
    finally:
        kill_tree(launcher, tree)
    assert "pipeline run #1 completed" not in (tmp_path / "run.log").read_text()

    shown = json.loads(run_baton("lineage", "show", "1", "--json", f"run.dir={tmp_path}",
                                 check=True).stdout)
    assert shown["pipeline_run"]["status"] == "crashed", shown["pipeline_run"]
    assert {s["status"] for s in shown["stage_runs"]} == {"crashed"}, shown["stage_runs"]
