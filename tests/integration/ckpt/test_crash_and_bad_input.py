"""A worker killed mid-save leaves `latest` sound; bad input changes nothing."""
from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from tests.conftest import metrics, run_baton

pytestmark = pytest.mark.slow


def _tree_digest(path: Path) -> dict:
    return {p.relative_to(path).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(path.rglob("*")) if p.is_file()}


def test_sigkill_during_a_save_leaves_latest_verifiable_and_resumable(tmp_path):
    common = [f"run.dir={tmp_path}", "stage.max_steps=6", "stage.save_every=2",
              "parallel.world_size=2", "parallel.zero_stage=2"]
    crashed = run_baton("stage", "cpt", *common, "debug.crash_in_save_at_step=4")
    assert crashed.returncode != 0
    root = tmp_path / "cpt" / "checkpoints"
    assert (root / "latest").read_text() == "step-000002"
    assert (root / "step-000004.tmp").is_dir(), "the killed save should leave its tmp directory"
    assert run_baton("ckpt", "verify", str(root / "step-000002")).returncode == 0
    leftover = run_baton("ckpt", "verify", str(root / "step-000004.tmp"))
    assert leftover.returncode == 1 and "uncommitted checkpoint" in leftover.stderr

    run_baton("stage", "cpt", *common, "resume=latest", check=True)
    assert (root / "latest").read_text() == "step-000006"
    assert not (root / "step-000004.tmp").exists()
    assert run_baton("ckpt", "verify", str(root / "step-000004")).returncode == 0
    assert sorted(metrics(tmp_path, "cpt")) == [1, 2, 3, 4, 5, 6]


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("trained")
    run_baton("stage", "cpt", f"run.dir={run_dir}", "stage.max_steps=2", "stage.save_every=2",
              check=True)
    return run_dir


@pytest.mark.parametrize("overrides,message", [
    (["stage.max_stepz=3"], "unknown config key 'stage.max_stepz'"),
    (["parallel.world_size=two"], "Value 'two' of type 'str' could not be converted to Integer"),
    (["resume=/nonexistent/step-000001"], "resume='/nonexistent/step-000001': no such checkpoint"),
    (["resume=latest", "model.hidden_size=32"], "hidden_size: checkpoint has 128, this run has 32"),
    (["resume=latest", "parallel.world_size=2"],
     "A plain resume cannot change the layout; convert it through a universal checkpoint"),
    (["resume=latest", "parallel.zero_stage=2"], "baton ckpt reshard"),
])
def test_bad_input_exits_nonzero_with_a_clear_message_and_writes_nothing(
        trained, tmp_path, overrides, message):
    before = _tree_digest(trained)
    run_dir = trained
    if "model.hidden_size=32" in overrides:
        # A different built-in model lives in its own run home; point its resume at ours.
        run_dir = tmp_path / "other"
        overrides = [f"resume={trained}/cpt/checkpoints/step-000002", "model.hidden_size=32"]
    proc = run_baton("stage", "cpt", f"run.dir={run_dir}", "stage.max_steps=4", *overrides)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert message in proc.stderr, proc.stderr
    assert _tree_digest(trained) == before


def test_every_config_error_is_reported_at_once(tmp_path):
    proc = run_baton("stage", "cpt", f"run.dir={tmp_path}", "stage.max_stepz=3",
                     "parallel.world_size=two", "stage.global_batch=10")
    assert proc.returncode == 2
    assert "3 configuration error(s)" in proc.stderr
    assert "stage.global_batch=10 is not divisible" in proc.stderr
    assert "stage.max_stepz" in proc.stderr and "parallel.world_size" in proc.stderr
    assert not (tmp_path / "cpt").exists()


def test_model_path_takes_any_local_hugging_face_directory(trained, tmp_path):
    hf_dir = trained / "model"  # the built-in model, saved by save_pretrained
    run_baton("stage", "cpt", f"run.dir={tmp_path}", f"model.path={hf_dir}", "stage.max_steps=1",
              "stage.save_every=1", check=True)
    meta = (tmp_path / "cpt" / "checkpoints" / "step-000001" / "meta.json").read_text()
    assert f'"model_dir": "{hf_dir}"' in meta
    assert not (tmp_path / "model").exists(), "no built-in model is created when model.path is set"
