"""Selective persistence with real DeepSpeed saves (ZeRO 0): threshold 0 resumes bit for
bit; a positive threshold writes less, keeps every referenced checkpoint through
retention and resumes from the composite; a missing referenced file is refused."""
from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from tests.conftest import metrics, run_baton

pytestmark = pytest.mark.slow
COMMON = ["stage.max_steps=6", "stage.save_every=1", "stage.eval_every=3"]


def _written_bytes(root: Path) -> int:
    """What the saves wrote: each manifest's own files (references were written before)."""
    return sum(entry["size"] for d in root.glob("step-*")
               for entry in json.loads((d / "manifest.json").read_text())["files"].values())


def test_threshold_zero_resumes_bit_for_bit(tmp_path):
    zero = ["ckpt.selective.threshold=0", "ckpt.selective.full_every=100"]
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    run_baton("stage", "cpt", f"run.dir={straight}", *COMMON, *zero, "stage.keep_last=10",
              check=True)
    start = straight / "cpt/checkpoints/step-000003"
    run_baton("stage", "cpt", f"run.dir={resumed}", *COMMON, *zero, f"resume={start}", check=True)
    final = "cpt/checkpoints/step-000006"
    diff = run_baton("ckpt", "diff", str(straight / final), str(resumed / final))
    assert diff.returncode == 0 and "IDENTICAL" in diff.stdout, diff.stdout + diff.stderr
    a, b = metrics(straight, "cpt"), metrics(resumed, "cpt")
    assert all(a[s]["loss"] == b[s]["loss"] for s in (4, 5, 6))


@pytest.fixture(scope="module")
def selective(tmp_path_factory):
    """Full saves and selective saves of the same six steps (a frozen-ish chain: only
    the first save is full, retention keeps two)."""
    root = tmp_path_factory.mktemp("selective")
    run_baton("stage", "cpt", f"run.dir={root / 'full'}", *COMMON, "stage.keep_last=10", check=True)
    run_baton("stage", "cpt", f"run.dir={root / 'sel'}", *COMMON, "stage.keep_last=2",
              "ckpt.selective.threshold=0.2", "ckpt.selective.full_every=100", check=True)
    return root


def test_selective_saves_write_less_and_retention_keeps_what_is_referenced(selective):
    full, sel = selective / "full/cpt/checkpoints", selective / "sel/cpt/checkpoints"
    kept = sorted(p.name for p in sel.glob("step-*"))
    referenced = {e["checkpoint"] for d in sel.glob("step-*") for e in
                  json.loads((d / "manifest.json").read_text()).get("references", {}).values()}
    assert referenced and referenced <= set(kept)  # kept beyond keep_last=2 when referenced
    assert {"step-000005", "step-000006"} <= set(kept)
    for name in kept:
        assert run_baton("ckpt", "verify", str(sel / name)).returncode == 0
    # Only the newest two of the full run are comparable to what the selective run kept.
    full_last_two = sum(json.loads((full / n / "manifest.json").read_text())["files"][f]["size"]
                        for n in ("step-000005", "step-000006")
                        for f in json.loads((full / n / "manifest.json").read_text())["files"])
    sel_last_two = sum(json.loads((sel / n / "manifest.json").read_text())["files"][f]["size"]
                       for n in ("step-000005", "step-000006")
                       for f in json.loads((sel / n / "manifest.json").read_text())["files"])
    assert sel_last_two < full_last_two / 2


def test_resume_from_a_composite_checkpoint_and_refuse_a_broken_chain(selective, tmp_path):
    sel = selective / "sel/cpt/checkpoints"
    run_dir = tmp_path / "from-composite"
    resumed = run_baton("stage", "cpt", f"run.dir={run_dir}", *COMMON[1:], "stage.max_steps=8",
                        f"resume={sel / 'step-000006'}", "ckpt.selective.threshold=0.2")
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    assert sorted(metrics(run_dir, "cpt")) == [7, 8]

    broken = tmp_path / "broken/cpt/checkpoints"
    shutil.copytree(sel, broken)
    manifest = json.loads((broken / "step-000006/manifest.json").read_text())
    rel, entry = next(iter(manifest["references"].items()))
    (broken / entry["checkpoint"] / rel).unlink()
    before = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in broken.rglob("*") if p.is_file()}
    refused = run_baton("stage", "cpt", f"run.dir={tmp_path / 'broken'}", *COMMON, "resume=latest",
                        "stage.keep_last=2", "ckpt.selective.threshold=0.05")
    assert refused.returncode == 2, refused.stdout[-2000:]
    assert f"missing file {rel}, referenced in {entry['checkpoint']}" in refused.stderr
    assert "Traceback" not in refused.stderr
    after = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in broken.rglob("*") if p.is_file()}
    assert after == before  # nothing written, nothing removed
    verify = run_baton("ckpt", "verify", str(broken / "step-000006"))
    assert verify.returncode == 1 and rel in verify.stderr


def test_selective_saves_outside_zero_0_are_refused_before_anything_starts(tmp_path):
    refused = run_baton("stage", "cpt", f"run.dir={tmp_path}", "parallel.zero_stage=1",
                        "ckpt.selective.threshold=0.1")
    assert refused.returncode == 2
    assert "ckpt.selective.threshold with parallel.zero_stage=1" in refused.stderr
    assert not (tmp_path / "cpt").exists()


def test_a_memory_tier_copy_of_a_selective_save_stands_alone_and_restores(tmp_path):
    from ckpt.tiers.plan import TierPlan
    from core.config import compose

    tiered = [f"run.dir={tmp_path}", "stage.save_every=3", "stage.eval_every=3",
              "ckpt.selective.threshold=0.2", "ckpt.tiers.memory.every=1"]
    memory = TierPlan.from_config(compose(["stage=cpt", *tiered])).memory_root()
    try:
        run_baton("stage", "cpt", *tiered, "stage.max_steps=5", check=True)
        # Step 5 was written to the run directory (its references point at step 3 there)
        # and copied to the memory tier, where it carries the layer files it uses.
        saved = json.loads((tmp_path / "cpt/checkpoints/step-000005/manifest.json").read_text())
        copied = json.loads((memory / "step-000005/manifest.json").read_text())
        assert saved["references"] and "references" not in copied
        assert set(saved["references"]) <= set(copied["files"])
        for kept in memory.glob("step-*"):  # memory-only saves reference within the tier
            assert run_baton("ckpt", "verify", str(kept)).returncode == 0
        restarted = run_baton("stage", "cpt", *tiered, "stage.max_steps=7", "resume=latest",
                              check=True)
        assert "restore: step-000005 from the memory tier" in restarted.stdout
        assert sorted(metrics(tmp_path, "cpt")) == list(range(1, 8))
    finally:
        shutil.rmtree(memory.parents[2], ignore_errors=True)
