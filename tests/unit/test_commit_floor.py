"""bench.commit_floor: every save leaves what a baton save leaves (the template's files and
sizes, the state's bytes copied at that save, `latest` on the newest, `keep_last` kept,
nothing half-done), and closing removes all of it."""
from __future__ import annotations

from pathlib import Path

import torch

from bench.commit_floor import CommitFloorEveryStep, files_of


class TinyState:
    """What the floor reads of a bench state: its tensors."""

    def __init__(self):
        self.weights = torch.arange(1000, dtype=torch.float32)  # 4000 bytes
        self.moments = torch.ones(10, dtype=torch.float64)  # 80 bytes

    def tensors(self) -> list[torch.Tensor]:
        return [self.weights, self.moments]


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


def test_every_save_is_committed_like_a_baton_save_and_close_leaves_nothing(tmp_path):
    shape = template(tmp_path / "template")
    state = TinyState()
    floor = CommitFloorEveryStep(state, tmp_path / "work", shape, keep_last=2)
    root = floor.root
    try:
        floor.save()
        state.weights.add_(1)  # in place, as an optimizer step: the next save copies it again
        for _ in range(2):
            floor.save()
        floor.drain()
        assert sorted(p.name for p in root.iterdir()) == ["latest", "step-000002", "step-000003"]
        assert (root / "latest").read_text() == "step-000003"
        newest = root / "step-000003"
        assert files_of(newest) == files_of(shape)
        written = (newest / "mp_rank_00_model_states.pt").read_bytes()
        state_bytes = state.weights.numpy().tobytes() + state.moments.numpy().tobytes()
        assert written == state_bytes + bytes(4500 - len(state_bytes))
        assert (newest / "rng" / "rank-00000.json").read_bytes() == state_bytes[:40]
    finally:
        floor.close()
    assert not (tmp_path / "work" / "commit-floor").exists()
