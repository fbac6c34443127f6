"""One owner per run directory and stage, and no orphan workers.

A second launch on a running stage is refused at once, naming the holder; a lock left by
a killed owner is taken over; `baton ckpt gc` keeps off a running stage; workers never
read another launcher's launch file; and SIGKILL of the launcher takes torchrun and
every worker with it, after which a resume works.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from core import processes
from stages import lifeline
from stages.run_lock import STAGE_LOCK, RunDirectoryBusy, stage_lock
from tests.conftest import REPO, run_baton
from tests.process_tree import descendants, kill_tree, start_baton, wait_until

HOLDER = textwrap.dedent("""
    import subprocess, sys, time
    from stages.run_lock import stage_lock
    with stage_lock(sys.argv[1]):
        child = subprocess.Popen(["sleep", "120"])  # a "worker": must not inherit the lock
        print(child.pid, flush=True)
        time.sleep(120)
""")


def _holder_record(stage_directory: Path) -> dict:
    lock = stage_directory / STAGE_LOCK
    text = lock.read_text() if lock.is_file() else ""
    try:
        return json.loads(text) if text.strip() else {}
    except ValueError:  # read while the holder was writing it
        return {}


def test_a_held_lock_is_refused_by_name_and_a_dead_holders_lock_is_taken_over(tmp_path, capsys):
    stage = tmp_path / "cpt"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(stage)], cwd=REPO,
                              stdout=subprocess.PIPE, text=True)
    worker_pid = int(holder.stdout.readline())
    try:
        with pytest.raises(RunDirectoryBusy) as info:
            with stage_lock(stage):
                pass
        record = _holder_record(stage)
        message = str(info.value)
        assert f"stage directory {stage} is in use: {stage / STAGE_LOCK} is held by pid " \
               f"{holder.pid} on host {processes.hostname()} (started {record['started']}; " \
               f"command: python -c" in message
        assert "so this one did not start" in message
        assert f"stop it (`kill {holder.pid}` on {processes.hostname()})" in message
        assert info.value.holder["pid"] == holder.pid

        holder.kill()  # SIGKILL: no release, the record stays; the "worker" lives on
        holder.wait()
        assert processes.identity_of(worker_pid) is not None, "the child should still run"
        assert _holder_record(stage)["pid"] == holder.pid
        with stage_lock(stage):  # the child did not inherit the lock: it is free
            assert _holder_record(stage)["pid"] == os.getpid()
        assert (f"{stage / STAGE_LOCK}: taking over the lock left by pid {holder.pid} on host "
                f"{processes.hostname()}") in capsys.readouterr().out
        assert (stage / STAGE_LOCK).read_text() == "", "a clean release leaves no record"
    finally:
        holder.kill()
        holder.wait()
        os.kill(worker_pid, signal.SIGKILL)


def test_ckpt_gc_refuses_a_running_stage_and_cleans_it_once_its_holder_is_gone(tmp_path):
    root = tmp_path / "cpt" / "checkpoints"
    (root / "step-000003.tmp").mkdir(parents=True)
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path / "cpt")], cwd=REPO,
                              stdout=subprocess.PIPE, text=True)
    worker_pid = int(holder.stdout.readline())
    try:
        refused = run_baton("ckpt", "gc", str(root))
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert f"is held by pid {holder.pid} on host {processes.hostname()}" in refused.stderr
        assert ("`baton ckpt gc` removed nothing there: a running save's step-N.tmp looks just "
                f"like a dead one's. Wait for that run to finish or stop it (`kill {holder.pid}`"
                in refused.stderr)
        assert (root / "step-000003.tmp").is_dir()
    finally:
        holder.kill()
        holder.wait()
        os.kill(worker_pid, signal.SIGKILL)
    cleaned = run_baton("ckpt", "gc", f"run.dir={tmp_path}", check=True)
    assert f"taking over the lock left by pid {holder.pid}" in cleaned.stdout
    assert f"removed {root / 'step-000003.tmp'}: a save that never committed" in cleaned.stdout
    assert f"gc {root}: removed 1 leftover(s); kept 0 committed checkpoint(s)" in cleaned.stdout
    assert not (root / "step-000003.tmp").exists()


def test_a_worker_refuses_a_launch_file_another_launcher_rewrote(tmp_path, monkeypatch):
    monkeypatch.delenv(lifeline.ENV_CHAIN, raising=False)
    launch = tmp_path / "launch.json"
    ours = lifeline.write_launch_file(launch, {"config": {"seed": 1}})
    lifeline.write_launch_file(launch, {"config": {"seed": 2}})  # a second launcher
    monkeypatch.setenv(lifeline.ENV_NONCE, ours[lifeline.ENV_NONCE])
    with pytest.raises(lifeline.LaunchFileNotOurs) as info:
        lifeline.worker_start(launch)
    assert f"{launch} belongs to another launch" in str(info.value)
    assert "another baton process rewrote it after this one started" in str(info.value)
    monkeypatch.setenv(lifeline.ENV_NONCE, json.loads(launch.read_text())["nonce"])
    assert lifeline.worker_start(launch)["config"] == {"seed": 2}


def test_a_process_whose_launcher_is_already_gone_exits_at_once():
    """The race pdeathsig misses: the launcher died before the child tied itself to it."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    identity = processes.identity_of(gone.pid)
    gone.wait()
    proc = subprocess.run(
        [sys.executable, "-c", "from stages.lifeline import hold; hold(); print('survived')"],
        cwd=REPO, capture_output=True, text=True, timeout=60,
        env={**os.environ, lifeline.ENV_CHAIN: identity.token()})
    assert proc.returncode == lifeline.EXIT_CODE
    assert "survived" not in proc.stdout
    assert f"exits: its parent (pid {identity.pid}) has exited; no orphan may keep " \
           "training" in proc.stderr


def test_the_watchdog_ends_a_process_when_a_launcher_above_its_parent_dies():
    """pdeathsig only sees the parent; the watchdog sees the whole chain (here the parent,
    this test, stays alive and a "launcher" above it dies)."""
    launcher = subprocess.Popen(["sleep", "120"])
    chain = f"{processes.identity_of(launcher.pid).token()},{processes.current().token()}"
    held = subprocess.Popen(
        [sys.executable, "-c", "import time; from stages.lifeline import hold; hold(); "
         "print('held', flush=True); time.sleep(120)"],
        cwd=REPO, env={**os.environ, lifeline.ENV_CHAIN: chain},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert held.stdout.readline().strip() == "held"
        launcher.kill()
        launcher.wait()
        assert held.wait(timeout=5) == lifeline.EXIT_CODE
        assert f"its launcher (pid {launcher.pid}) has exited" in held.stderr.read()
    finally:
        held.kill()
        launcher.kill()
        held.wait()
        launcher.wait()


@pytest.mark.slow
def test_a_second_launch_on_a_running_stage_is_refused_and_the_first_is_untouched(tmp_path):
    common = [f"run.dir={tmp_path}", "stage.max_steps=4", "stage.save_every=2", "parallel=single"]
    first = start_baton(tmp_path / "first.log", "stage", "cpt", *common, "seed=1")
    try:
        record = wait_until(lambda: _holder_record(tmp_path / "cpt").get("pid") == first.pid
                            and _holder_record(tmp_path / "cpt"), 120, what="the first run's lock")
        second = run_baton("stage", "cpt", *common, "seed=2")
        assert first.poll() is None, "the second launch must not wait for the first"
        assert second.returncode == 2, second.stdout + second.stderr
        assert (f"is held by pid {first.pid} on host {processes.hostname()} (started "
                f"{record['started']}; command: baton stage cpt run.dir={tmp_path}") in second.stderr
        assert "seed=1" in second.stderr and "give this run its own run.dir" in second.stderr
        assert "[cpt] step" not in second.stdout
        assert first.wait(timeout=600) == 0, (tmp_path / "first.log").read_text()
    finally:
        kill_tree(first)
    root = tmp_path / "cpt" / "checkpoints"
    for step in ("step-000002", "step-000004"):
        assert json.loads((root / step / "meta.json").read_text())["config"]["seed"] == 1
    assert json.loads((tmp_path / "cpt" / "launch.json").read_text())["config"]["seed"] == 1
    steps = [json.loads(line)["step"] for line in
             (tmp_path / "cpt" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4]


@pytest.mark.slow
def test_sigkill_of_the_launcher_leaves_no_worker_alive_and_resume_works(tmp_path):
    common = [f"run.dir={tmp_path}", "stage.max_steps=30", "stage.save_every=1",
              "parallel.world_size=2", "parallel.zero_stage=2"]
    launcher = start_baton(tmp_path / "killed.log", "stage", "cpt", *common)
    tree = []
    try:
        # Training is under way and a checkpoint is committed, so the resume has one.
        wait_until(lambda: (tmp_path / "cpt" / "checkpoints" / "latest").is_file(), 300,
                   what="the first checkpoint")
        tree = descendants(launcher.pid)
        assert len(tree) >= 3, f"expected torchrun and 2 workers under baton, found {tree}"
        launcher.send_signal(signal.SIGKILL)  # the launcher only, not its group
        launcher.wait()
        killed_at = time.monotonic()
        wait_until(lambda: not any(p.alive() for p in tree), 5, interval=0.1,
                   what=f"torchrun and the workers to die ({[p.pid for p in tree]})")
        assert time.monotonic() - killed_at <= 5
    finally:
        kill_tree(launcher, tree)
    log = (tmp_path / "killed.log").read_text()
    assert "stage cpt completed" not in log, "the run finished before it could be killed"
    latest = (tmp_path / "cpt" / "checkpoints" / "latest").read_text()
    resumed = run_baton("stage", "cpt", *common, "resume=latest", check=True)
    assert f"resumed from {tmp_path / 'cpt' / 'checkpoints' / latest}" in resumed.stdout
    assert f"taking over the lock left by pid {launcher.pid}" in resumed.stdout
    assert "stage cpt completed at step 30" in resumed.stdout
