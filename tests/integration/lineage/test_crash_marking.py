"""A run left `running` by a process that is gone is marked `crashed` the next time
anything opens the store; runs of live owners, of other hosts and finished runs are not."""
from __future__ import annotations

import os
import subprocess
import sys

from core import processes
from core.processes import ProcessIdentity
from lineage.store import LineageStore


def _dead_process() -> ProcessIdentity:
    """A real process that ran on this host and is gone (killed and reaped)."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    identity = processes.identity_of(child.pid)
    child.kill()
    child.wait()
    assert identity is not None and not identity.alive()
    return identity


def test_runs_whose_owner_died_are_marked_crashed_when_the_store_is_next_opened(db_url):
    dead = _dead_process()
    with LineageStore.open(db_url) as store:
        pipeline = store.record_pipeline_run("baton", {}, "h", 1, "v", owner=dead)
        stage = store.record_stage_run(pipeline.id, "cpt", {"world_size": 2}, owner=dead)
        finished = store.record_stage_run(pipeline.id, "sft", {}, owner=dead)
        store.finish_stage_run(finished.id, "completed")
        assert (stage.owner_host, stage.owner_pid) == (processes.hostname(), dead.pid)
        assert store.pipeline_run(pipeline.id).status == "running"

    with LineageStore.open(db_url) as store:
        assert store.pipeline_run(pipeline.id).status == "crashed"
        assert store.pipeline_run(pipeline.id).ended_at is not None
        crashed = store.stage_run(stage.id)
        assert crashed.status == "crashed" and crashed.ended_at is not None
        events = store.events(stage.id)
        assert [(e.role, e.kind) for e in events] == [("lineage", "crashed")]
        assert events[0].detail["owner_pid"] == dead.pid
        assert events[0].detail["owner_pid_start"] == dead.start_ticks
        assert "its owner process is no longer running" in events[0].detail["reason"]
        assert store.stage_run(finished.id).status == "completed"
        assert store.events(finished.id) == []


def test_a_live_owner_keeps_its_runs_running_but_a_reused_pid_does_not(db_url):
    me = processes.current()
    reused = ProcessIdentity(me.host, os.getpid(), me.start_ticks - 1)  # same pid, another start
    with LineageStore.open(db_url) as store:
        live = store.record_pipeline_run("baton", {}, "h", 1, "v")  # owner: this process
        live_stage = store.record_stage_run(live.id, "cpt", {})
        stolen = store.record_stage_run(live.id, "sft", {}, owner=reused)
    with LineageStore.open(db_url) as store:
        assert store.pipeline_run(live.id).status == "running"
        assert store.stage_run(live_stage.id).status == "running"
        assert store.stage_run(stolen.id).status == "crashed"


def test_runs_owned_by_another_host_are_left_alone(db_url):
    dead = _dead_process()
    elsewhere = ProcessIdentity("some-other-host", dead.pid, dead.start_ticks)
    with LineageStore.open(db_url) as store:
        pipeline = store.record_pipeline_run("baton", {}, "h", 1, "v", owner=elsewhere)
        stage = store.record_stage_run(pipeline.id, "cpt", {}, owner=elsewhere)
    with LineageStore.open(db_url) as store:
        assert store.pipeline_run(pipeline.id).status == "running"
        assert store.stage_run(stage.id).status == "running"
