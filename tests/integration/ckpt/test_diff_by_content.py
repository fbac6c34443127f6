"""`baton ckpt diff` compares what checkpoints hold, not where they lie: the same run in two
run directories, and a checkpoint copied elsewhere with its recorded paths rewritten,
are IDENTICAL with equal content digests; the paths are informational notes.

Real DeepSpeed workers write the checkpoints (two 2-step CPT runs, about a minute).
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from ckpt import content_hash
from ckpt.content_digest import content_digest_of
from tests.conftest import run_baton

pytestmark = pytest.mark.slow
FINAL = Path("cpt") / "checkpoints" / "step-000002"


def _train(run_dir: Path) -> Path:
    run_baton("stage", "cpt", f"run.dir={run_dir}", "stage.max_steps=2", "stage.save_every=2",
              check=True)
    return run_dir / FINAL


@pytest.fixture(scope="module")
def two_places(tmp_path_factory) -> tuple[Path, Path]:
    """The same run in two run directories of different depth."""
    root = tmp_path_factory.mktemp("places")
    return _train(root / "a"), _train(root / "deeper" / "b")


def _digest_lines(a: Path, b: Path) -> list[str]:
    digest = content_digest_of(a)
    return [f"content digest A: {digest}", f"content digest B: {digest} (equal: the same state)"]


def test_the_same_run_in_two_run_directories_is_identical(two_places):
    a, b = two_places
    diff = run_baton("ckpt", "diff", str(a), str(b))
    assert diff.returncode == 0, diff.stdout[-3000:] + diff.stderr[-2000:]
    lines = diff.stdout.splitlines()
    assert lines[-3:] == [*_digest_lines(a, b), "IDENTICAL"]
    [note] = [line for line in lines if line.startswith("note: ")]
    assert note.startswith("note: meta.json differs at ") and "config.run.dir" in note
    assert "(informational: how and where it was run, not what it holds)" in note


def _relocate(text: str, old: Path, new: Path) -> str:
    return text.replace(str(old), str(new))


def test_a_copy_with_its_recorded_paths_rewritten_is_identical(two_places, tmp_path):
    """meta.json's new bytes get a new manifest entry (without it verify refuses the copy,
    rightly); the manifest's `extra` names another source."""
    original = two_places[0]
    copy = tmp_path / "moved" / original.name
    shutil.copytree(original, copy)
    old_run = original.parents[2]
    meta = copy / "meta.json"
    meta.write_text(_relocate(meta.read_text(), old_run, tmp_path / "moved"))
    data = json.loads((copy / "manifest.json").read_text())
    data["files"]["meta.json"] = content_hash.hash_file(meta, data["hashing"])
    data["extra"]["parent"] = {"resharded_from": str(tmp_path / "elsewhere" / "step-000002")}
    data["extra"]["source"] = str(tmp_path / "elsewhere")
    (copy / "manifest.json").write_text(json.dumps(data))

    diff = run_baton("ckpt", "diff", str(original), str(copy))
    assert diff.returncode == 0, diff.stdout[-3000:] + diff.stderr[-2000:]
    lines = diff.stdout.splitlines()
    assert lines[-3:] == [*_digest_lines(original, copy), "IDENTICAL"]
    notes = sorted(line for line in lines if line.startswith("note: "))
    assert len(notes) == 2, notes
    assert notes[0].startswith("note: manifest.json differs at extra.parent")
    assert "extra.parent.resharded_from, extra.source (informational:" in notes[0]
    assert notes[1].startswith("note: meta.json differs at ") and "model_dir" in notes[1]
