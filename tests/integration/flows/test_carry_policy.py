"""Carry policy: Adam moments and scheduler position cross a boundary only when asked."""
from __future__ import annotations

import io

import pytest
import torch

from ckpt import manifest as manifest_io
from ckpt.safe_load import allow_deepspeed_globals as _allow_deepspeed_globals
from tests.conftest import run_baton

pytestmark = pytest.mark.slow


def _adam_steps(ckpt) -> set[int]:
    manifest = manifest_io.verify(ckpt)
    _allow_deepspeed_globals()
    states = torch.load(io.BytesIO((ckpt / manifest.components["optimizer"][0]).read_bytes()),
                        weights_only=True)
    return {int(s["step"]) for s in states["optimizer"]["state"].values()}


def test_optimizer_moments_carry_only_when_the_policy_says_so(tmp_path):
    run_baton("stage", "cpt", f"run.dir={tmp_path / 'cpt'}", "stage.max_steps=3",
              "stage.save_every=3", check=True)
    source = tmp_path / "cpt" / "cpt" / "checkpoints" / "step-000003"
    common = ["stage.max_steps=1", "stage.save_every=1", f"stage.init_from={source}"]
    fresh = run_baton("stage", "sft", f"run.dir={tmp_path / 'fresh'}", *common, check=True)
    carried = run_baton("stage", "sft", f"run.dir={tmp_path / 'carried'}", *common,
                        "stage.init_optimizer=true", "stage.init_scheduler=true", check=True)
    assert "inherited optimizer moments, LR scheduler position from" in carried.stdout
    assert "inherited" not in fresh.stdout
    step1 = "sft/checkpoints/step-000001"
    assert _adam_steps(tmp_path / "fresh" / step1) == {1}
    assert _adam_steps(tmp_path / "carried" / step1) == {4}  # 3 CPT updates + 1 SFT update


def test_carrying_across_layouts_is_refused_with_the_reshard_hint(tmp_path):
    run_baton("stage", "cpt", f"run.dir={tmp_path / 'cpt'}", "stage.max_steps=1",
              "stage.save_every=1", check=True)
    source = tmp_path / "cpt" / "cpt" / "checkpoints" / "step-000001"
    proc = run_baton("stage", "sft", f"run.dir={tmp_path / 'sft'}", "stage.max_steps=1",
                     f"stage.init_from={source}", "stage.init_optimizer=true",
                     "parallel.world_size=2", "parallel.zero_stage=1")
    assert proc.returncode == 2, "refused before any worker starts"
    assert "cannot carry optimizer/scheduler/RNG from layout" in proc.stderr
    assert "baton ckpt reshard" in proc.stderr
    assert not (tmp_path / "sft" / "sft" / "checkpoints").exists()
