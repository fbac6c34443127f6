"""`ckpt.saver=process`: asynchronous saves finished in a saver process of their own, in one
in-process rank (a real DeepSpeed engine, gloo) and one worker subprocess. The saver
process writes what the saver thread writes, holds the state of the save call, reports a
disk failure as the thread does, fails every save when it dies, and dies with its worker."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest
import torch

from bench.state import build_state
from bench.training import train_steps
from ckpt import manifest as manifest_io
from ckpt.checkpointer import Checkpointer, SaveOptions
from ckpt.cleanup import find_leftovers
from ckpt.errors import CheckpointWriteFailed
from ckpt.layout import committed_steps, read_latest
from ckpt.saver_process import ProcessSaver
from core.processes import identity_of
from tests.conftest import REPO
from tests.integration.ckpt.in_process_rank import payload, saved_weights
from tests.process_tree import wait_until

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def state(tmp_path_factory):
    built = build_state("tiny", [], tmp_path_factory.mktemp("saver-process-run"), None)
    yield built
    built.close()


def _checkpointer(state, root, saver="process", fail_write_at_step=-1, **options) -> Checkpointer:
    ck = Checkpointer(state.engine, root, "cpt", state.layout, keep_last=2,
                      fail_write_at_step=fail_write_at_step,
                      options=SaveOptions(mode="async", saver=saver, **options))
    assert isinstance(ck.background, ProcessSaver) == (saver == "process")
    return ck


def test_the_saver_process_writes_what_the_saver_thread_writes_and_stops_at_close(state, tmp_path):
    manifests = {}
    for saver in ("thread", "process"):
        ck = _checkpointer(state, tmp_path / saver, saver=saver)
        for step in (1, 2, 3):  # the third reuses the slot's buffers and staged tensors
            path = ck.save(step, payload(step))
        if saver == "process":
            saver_process = ck.background.process
        ck.close()
        manifests[saver] = manifest_io.verify(path)
        assert [p.name for p in committed_steps(tmp_path / saver)] == ["step-000002", "step-000003"]
        assert find_leftovers(tmp_path / saver) == []
    assert saver_process.poll() is not None, "close() left the saver process running"
    thread, process = manifests["thread"], manifests["process"]
    assert set(thread.files) == set(process.files)
    assert all(thread.files[rel] == process.files[rel] for rel in thread.files
               if rel != "rng/rank_0.json")  # each save records the RNG of its own moment
    assert thread.components == process.components


def test_a_lazy_save_in_the_saver_process_holds_the_state_of_the_save_call(state, tmp_path):
    ck = _checkpointer(state, tmp_path, snapshot="lazy")
    ck.save(1, payload(1))  # the first save allocates and sends the buffers
    ck.drain()
    before = {k: v.detach().clone() for k, v in state.module.state_dict().items()}
    path = ck.save(2, payload(2))
    train_steps(state.engine, state.cfg.stage, steps=1)  # changes every weight
    ck.close()
    after = state.module.state_dict()
    assert not all(torch.equal(after[k], before[k]) for k in before)
    manifest_io.verify(path)
    saved = saved_weights(path)
    assert all(torch.equal(saved[k], before[k]) for k in before)
    assert [s["step"] for s in ck.stats] == [1, 2]
    assert all(s["background_cpu_s"] is not None for s in ck.stats)


def test_a_disk_failure_in_the_saver_process_surfaces_and_keeps_latest(state, tmp_path):
    ck = _checkpointer(state, tmp_path, fail_write_at_step=2)
    ck.save(1, payload(1))
    ck.drain()
    ck.save(2, payload(2))  # its first write fails with ENOSPC in the saver process
    with pytest.raises(CheckpointWriteFailed) as failed:
        ck.drain()
    assert failed.value.step == 2 and failed.value.latest == "step-000001"
    assert "No space left on device" in str(failed.value)
    assert not (tmp_path / "step-000002.tmp").exists()
    with pytest.raises(CheckpointWriteFailed):  # no later save may move `latest` past it
        ck.save(3, payload(3))
    ck.close()
    assert read_latest(tmp_path).name == "step-000001"


def test_a_saver_process_that_dies_fails_the_saves_after_it_and_keeps_latest(state, tmp_path):
    ck = _checkpointer(state, tmp_path)
    ck.save(1, payload(1))
    ck.drain()
    saver = ck.background.process
    os.kill(saver.pid, signal.SIGKILL)  # our own child, by the handle that started it
    saver.wait(timeout=30)
    with pytest.raises(CheckpointWriteFailed) as failed:
        ck.save(2, payload(2))  # refused at once, or failed once the death is noticed
        ck.drain()
    assert failed.value.step == 2 and failed.value.latest == "step-000001"
    assert f"saver process (pid {saver.pid}) exited with code -9" in str(failed.value)
    ck.close()
    assert read_latest(tmp_path).name == "step-000001"


WORKER = textwrap.dedent("""
    import sys
    from pathlib import Path
    from bench.state import build_state
    from ckpt.checkpointer import Checkpointer, SaveOptions
    state = build_state("tiny", [], Path(sys.argv[1]) / "run", None)
    ck = Checkpointer(state.engine, Path(sys.argv[1]) / "ckpt", "cpt", state.layout, keep_last=2,
                      options=SaveOptions(mode="async", saver="process"))
    print("saver pid", ck.background.pid, flush=True)
    sys.stdin.read()  # until the test kills this worker
""")


def test_the_saver_process_dies_with_its_worker(tmp_path):
    worker = subprocess.Popen([sys.executable, "-c", WORKER, str(tmp_path)], cwd=REPO,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        line = ""
        while not line.startswith("saver pid "):  # DeepSpeed prints lines of its own
            line = worker.stdout.readline()
            assert line, "the worker exited before starting its saver"
        saver = identity_of(int(line.split()[-1]))
        assert saver is not None and saver.alive()
        worker.kill()  # SIGKILL: no close(), no finalizer; only PR_SET_PDEATHSIG is left
        worker.wait(timeout=30)
        wait_until(lambda: not saver.alive(), 10, what="the saver process to die with its worker")
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()


def test_a_save_that_cannot_be_handed_over_fails_as_that_save(state, tmp_path):
    ck = _checkpointer(state, tmp_path)
    ck.save(1, payload(1))
    ck.drain()
    unpicklable = payload(2)
    unpicklable.extra = {"hook": lambda: None}  # a manifest field no pickle can carry
    ck.save(2, unpicklable)
    with pytest.raises(CheckpointWriteFailed) as failed:
        ck.drain()
    assert failed.value.step == 2 and failed.value.latest == "step-000001"
    assert "could not hand the save to the saver process" in str(failed.value)
    ck.close()
    assert read_latest(tmp_path).name == "step-000001"


def _staging_mappings(pid: int) -> int:
    """The saver process's mappings of staging buffers (each buffer is a memfd of its own)."""
    with open(f"/proc/{pid}/maps") as maps:
        return sum("memfd:baton-staging" in line for line in maps)


def test_selective_saves_keep_their_staging_buffers_in_the_saver_process(state, tmp_path):
    """Selective saves (ckpt.selective) write a layer's file only when it changed enough or
    at a full save. The pool keeps the buffers of the layers a save leaves in an earlier
    checkpoint, so the saver process maps the state's buffers once, not once more per
    cycle of full saves for the whole run."""
    ck = _checkpointer(state, tmp_path, selective_threshold=1e9, selective_full_every=2)
    pid = ck.background.process.pid
    mapped, written = [], []
    for step in range(1, 9):  # nothing changes: layers are written at every other save only
        ck.save(step, payload(step))
        ck.drain()
        mapped.append(_staging_mappings(pid))
        written.append(len(ck.io.references))
    ck.close()
    assert 0 in written and max(written) > 0  # full saves and saves by reference, in turn
    assert mapped[0] > 0 and mapped == [mapped[0]] * len(mapped)


@pytest.mark.parametrize("saver", ["thread", "process"])
def test_either_saver_keeps_the_best_by_the_metric_saved_with_each_checkpoint(state, tmp_path, saver):
    """stage.keep_best: the step's metrics go into meta.json and the saver's retention keeps
    the best by them beside the newest keep_last (here 2), whichever saver commits."""
    from ckpt.retention import KeepBest

    ck = Checkpointer(state.engine, tmp_path, "cpt", state.layout, keep_last=2,
                      options=SaveOptions(mode="async", saver=saver),
                      keep_best=KeepBest(1, "eval_loss", "min"))
    for step, loss in ((1, 0.9), (2, 0.4), (3, 0.8), (4, 0.7), (5, 0.6)):
        saved = payload(step)
        saved.meta["metrics"] = {"step": step, "eval_loss": loss}
        ck.save(step, saved)
    ck.close()
    assert [p.name for p in committed_steps(tmp_path)] == ["step-000002", "step-000004", "step-000005"]
