"""Reshard pieces that need no DeepSpeed processes: the equivalence comparison, the
errors it raises, config and progress handling (fast)."""
from __future__ import annotations

import pytest
import torch

from core.config.compose import as_dict, compose
from core.errors import ConfigError
from ckpt import universal
from ckpt.equivalence import _max_abs_diffs
from ckpt.errors import ReshardNotEquivalent
from handoff.reshard import _first_traceback, _target_progress, target_config


def _universal_folder(root, exp_avg_sq_scale=1.0):
    for name, shape in (("a.weight", (2, 3)), ("b.bias", (4,))):
        directory = root / "zero" / name
        directory.mkdir(parents=True)
        base = torch.arange(float(torch.Size(shape).numel())).reshape(shape)
        for key, value in (("fp32", base), ("exp_avg", base / 10),
                           ("exp_avg_sq", base / 100 * exp_avg_sq_scale)):
            torch.save({"param": value, "cat_dim": 0}, directory / f"{key}.pt")
        torch.save(torch.tensor(2.0), directory / "step.pt")
    return root


def test_identical_universal_states_have_zero_difference_in_every_moment(tmp_path):
    a = universal.read_states(_universal_folder(tmp_path / "a"))
    b = universal.read_states(_universal_folder(tmp_path / "b"))
    assert [_max_abs_diffs(a, b, k) for k in ("fp32", "exp_avg", "exp_avg_sq")] == [0.0, 0.0, 0.0]
    assert universal.universal_step(tmp_path / "a") == 2.0


def test_a_changed_moment_or_a_missing_parameter_is_a_difference(tmp_path):
    a = universal.read_states(_universal_folder(tmp_path / "a"))
    b = universal.read_states(_universal_folder(tmp_path / "b", exp_avg_sq_scale=2.0))
    assert _max_abs_diffs(a, b, "exp_avg_sq") > 0.0
    del b["b.bias"]
    assert _max_abs_diffs(a, b, "fp32") == float("inf")


def test_not_equivalent_error_names_the_failed_checks_and_that_nothing_was_committed():
    details = {"checks": {"logits": True, "optimizer": False}, "passed": False}
    with pytest.raises(ReshardNotEquivalent, match=r"failed: optimizer\); nothing was committed at /d"):
        raise ReshardNotEquivalent("/s", "/d", details)


def test_micro_step_is_rescaled_to_the_target_accumulation_count():
    cfg = compose(["stage=cpt", "parallel.world_size=1"])
    progress = {"step": 2, "micro_step": 4, "micro_in_window": 0, "tokens_seen": 9, "samples_seen": 32}
    accumulation = cfg.stage.global_batch // cfg.stage.micro_batch
    assert _target_progress(progress, cfg) == {**progress, "micro_step": 2 * accumulation}


def test_target_config_keeps_the_stage_and_reports_bad_overrides():
    meta = {"config": as_dict(compose(["stage=cpt"]))}
    assert target_config("SRC", meta, ["parallel.zero_stage=3"]).parallel.zero_stage == 3
    with pytest.raises(ConfigError, match="resharding keeps the stage"):
        target_config("SRC", meta, ["stage.name=sft"])
    with pytest.raises(ConfigError, match="expected key=value"):
        target_config("SRC", meta, ["parallel.world_size"])


def test_a_workers_own_traceback_is_quoted_not_torchruns_summary():
    output = ("noise\n[rank1]: Traceback (most recent call last):\n[rank1]:   File \"x\"\n"
              "[rank1]: RuntimeError: boom\nTraceback (most recent call last):\nChildFailedError:")
    assert _first_traceback(output).endswith("[rank1]: RuntimeError: boom")
