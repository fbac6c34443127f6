"""bench.commit_floor: every save leaves what a baton save leaves (the template's files and
sizes, the state's bytes, `latest` on the newest, `keep_last` kept, nothing half-done),
its committer does no more durability work than a real baton save of the same
checkpoint, it stops when its launcher goes, and closing removes everything."""
from __future__ import annotations

import os
import time
from collections import Counter
from pathlib import Path

import pytest
import torch

from bench.commit_floor import CommitFloorEveryStep, files_of
from bench.commit_floor_child import Committer


class TinyState:
    """What the floor reads of a bench state, its tensors, and an optimizer that updates
    them in place, as a training step does."""

    def __init__(self):
        self.weights = torch.nn.Parameter(torch.arange(1000, dtype=torch.float32))  # 4000 bytes
        self.moments = torch.ones(10, dtype=torch.float64)  # 80 bytes
        self.optimizer = torch.optim.SGD([self.weights], lr=1.0)

    def tensors(self) -> list[torch.Tensor]:
        return [self.weights, self.moments]

    def bytes(self) -> bytes:
        return self.weights.detach().numpy().tobytes() + self.moments.numpy().tobytes()

    def step(self) -> None:
        self.weights.grad = torch.ones_like(self.weights)
        self.optimizer.step()


def template(root: Path) -> Path:
    """A checkpoint's shape: a file larger than the state, a small one in a subdirectory,
    and the manifest."""
    (root / "rng").mkdir(parents=True)
    (root / "mp_rank_00_model_states.pt").write_bytes(b"x" * 4500)
    (root / "rng" / "rank-00000.json").write_bytes(b"{}" * 20)
    (root / "manifest.json").write_bytes(b"m" * 100)
    (root / "data.json").write_bytes(b"{}")
    return root


def test_the_files_of_a_checkpoint_are_listed_with_the_manifest_last(tmp_path):
    directories, files = files_of(template(tmp_path / "step-000001"))
    assert directories == ["rng"]
    assert files == [("data.json", 2), ("mp_rank_00_model_states.pt", 4500),
                     ("rng/rank-00000.json", 40), ("manifest.json", 100)]
    (tmp_path / "step-000001" / "manifest.json").unlink()
    with pytest.raises(ValueError, match="needs a committed checkpoint"):
        files_of(tmp_path / "step-000001")


def test_every_save_is_committed_like_a_baton_save_and_close_leaves_nothing(tmp_path):
    """Each kept checkpoint holds the state as it was at its save call, though the copy
    runs on a thread and the next optimizer step comes at once: the step waits for it."""
    shape = template(tmp_path / "template")
    state = TinyState()
    floor = CommitFloorEveryStep(state, tmp_path / "work", shape, keep_last=2)
    root, child, copy = floor.root, floor.child, floor.copier.copy

    def slow_copy():
        time.sleep(0.2)  # without the wait, the step below would land before the copy
        copy()

    floor.copier.copy = slow_copy
    at_save = []
    try:
        for _ in range(3):
            at_save.append(state.bytes())
            floor.save()
            state.step()
        floor.drain()
        assert (floor.sent, floor.written, floor.committed) == (3, 3, 3)
        assert sorted(p.name for p in root.iterdir()) == ["latest", "step-000002", "step-000003"]
        assert (root / "latest").read_text() == "step-000003"
        for name, expected in (("step-000002", at_save[1]), ("step-000003", at_save[2])):
            assert files_of(root / name) == files_of(shape)
            written = (root / name / "mp_rank_00_model_states.pt").read_bytes()
            assert written == expected + bytes(4500 - len(expected)), name
            assert (root / name / "rng" / "rank-00000.json").read_bytes() == expected[:40]
        assert at_save[1] != at_save[2]
    finally:
        floor.close()
    assert child.returncode == 0
    assert not (tmp_path / "work" / "commit-floor").exists()
    floor.close()  # twice is harmless


def test_the_committer_stops_when_its_launcher_goes(tmp_path):
    floor = CommitFloorEveryStep(TinyState(), tmp_path / "work", template(tmp_path / "t"), 2)
    try:
        floor.child.stdin.close()  # what the kernel does to the pipe when the launcher dies
        assert floor.child.wait(timeout=30) == 0
    finally:
        floor.close()


def test_a_committer_that_dies_fails_the_run_and_close_still_cleans_up(tmp_path):
    floor = CommitFloorEveryStep(TinyState(), tmp_path / "work", template(tmp_path / "t"), 2)
    floor.child.kill()  # our own child, by its handle
    floor.child.wait()
    with pytest.raises(BrokenPipeError):
        floor.save()
        floor.drain()
    floor.close()
    assert not (tmp_path / "work" / "commit-floor").exists()


def counting(monkeypatch) -> Counter:
    """Counts os.fsync, os.rename and os.replace calls, on every thread."""
    calls = Counter()
    for name in ("fsync", "rename", "replace"):
        real = getattr(os, name)

        def counted(*args, _real=real, _name=name, **kwargs):
            calls[_name] += 1
            return _real(*args, **kwargs)

        monkeypatch.setattr(os, name, counted)
    return calls


@pytest.fixture(scope="module")
def bench_state(tmp_path_factory):
    from bench.state import build_state

    built = build_state("tiny", [], tmp_path_factory.mktemp("floor-run"), None)
    yield built
    built.close()


def test_the_committer_does_no_more_than_a_baton_save_of_the_same_checkpoint(
        bench_state, tmp_path, monkeypatch):
    """A floor must not be inflated: per save, its fsyncs and renames are at most those of
    a real baton save (the Python writer, whose fsyncs are os.fsync) that also retires one."""
    from bench.methods.baton_checkpointer import payload
    from ckpt.checkpointer import Checkpointer, SaveOptions
    from ckpt.layout import read_latest

    checkpointer = Checkpointer(bench_state.engine, tmp_path / "baton", "cpt", bench_state.layout,
                                keep_last=1, options=SaveOptions(mode="sync", writer="python"))
    checkpointer.save(1, payload(1, 1))
    calls = counting(monkeypatch)
    checkpointer.save(2, payload(2, 1))  # a synchronous save: committed, step 1 retired
    baton = dict(calls)
    checkpointer.close()
    shape = files_of(read_latest(tmp_path / "baton"))
    calls.clear()
    (tmp_path / "floor").mkdir()
    committer = Committer(memoryview(bytearray(1000)), tmp_path / "floor", 1,
                          {"directories": shape[0], "files": [list(f) for f in shape[1]]})
    committer.commit(committer.write_files())
    calls.clear()
    committer.commit(committer.write_files())  # retires the first
    floor = dict(calls)
    assert files_of(tmp_path / "floor" / "step-000002") == shape
    assert 0 < floor["fsync"] <= baton["fsync"]
    assert 0 < floor["rename"] + floor["replace"] <= baton["rename"] + baton["replace"]
