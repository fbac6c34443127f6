"""Each kind of damage is named by `baton ckpt verify` and refused by a resume.

One real checkpoint is produced per module (real DeepSpeed workers); each test
damages its own copy.
"""
from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from tests.conftest import run_baton

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("pristine")
    run_baton("stage", "cpt", f"run.dir={run_dir}", "stage.max_steps=2", "stage.save_every=2",
              "parallel.world_size=2", "parallel.zero_stage=1", check=True)
    return run_dir


@pytest.fixture
def run_dir(pristine, tmp_path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(pristine, copy)
    return copy


def _ckpt(run_dir: Path) -> Path:
    return run_dir / "cpt" / "checkpoints" / "step-000002"


def _tree_digest(path: Path) -> dict:
    return {p.relative_to(path).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(path.rglob("*")) if p.is_file()}


def _assert_refused(run_dir: Path, ckpt: Path, expected: str):
    verify = run_baton("ckpt", "verify", str(ckpt))
    assert verify.returncode == 1
    assert expected in verify.stderr, verify.stderr
    before = _tree_digest(run_dir / "cpt" / "checkpoints")
    resume = run_baton("stage", "cpt", f"run.dir={run_dir}", f"resume={ckpt}", "stage.max_steps=4",
                       "parallel.world_size=2", "parallel.zero_stage=1")
    assert resume.returncode == 2, resume.stdout + resume.stderr
    assert expected in resume.stderr
    assert _tree_digest(run_dir / "cpt" / "checkpoints") == before, "a refused resume wrote files"


def test_a_sound_checkpoint_verifies(pristine):
    verify = run_baton("ckpt", "verify", str(_ckpt(pristine)))
    assert verify.returncode == 0, verify.stderr
    assert "checksums match" in verify.stdout


def test_a_truncated_file_is_named(run_dir):
    target = _ckpt(run_dir) / "zero_pp_rank_1_mp_rank_00_optim_states.pt"
    target.write_bytes(target.read_bytes()[:1000])
    _assert_refused(run_dir, _ckpt(run_dir),
                    "size mismatch in zero_pp_rank_1_mp_rank_00_optim_states.pt: 1000 bytes on disk")


def test_a_flipped_byte_is_named(run_dir):
    target = _ckpt(run_dir) / "mp_rank_00_model_states.pt"
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0xFF
    target.write_bytes(bytes(data))
    _assert_refused(run_dir, _ckpt(run_dir), "checksum mismatch in mp_rank_00_model_states.pt")


def test_a_deleted_file_is_named(run_dir):
    (_ckpt(run_dir) / "rng" / "rank-00001.json").unlink()
    _assert_refused(run_dir, _ckpt(run_dir), "missing file rng/rank-00001.json")


def test_a_missing_manifest_means_not_a_checkpoint(run_dir):
    (_ckpt(run_dir) / "manifest.json").unlink()
    _assert_refused(run_dir, _ckpt(run_dir), "missing manifest.json: not a committed checkpoint")


def test_a_manifest_without_the_rng_component_is_incomplete(run_dir):
    path = _ckpt(run_dir) / "manifest.json"
    manifest = json.loads(path.read_text())
    rng_files = manifest["components"].pop("rng")
    for rel in rng_files:
        manifest["files"].pop(rel)
        (_ckpt(run_dir) / rel).unlink()
    path.write_text(json.dumps(manifest))
    _assert_refused(run_dir, _ckpt(run_dir), "missing component 'rng' in manifest.json")


def test_a_leftover_tmp_directory_is_not_a_checkpoint(run_dir):
    tmp = _ckpt(run_dir).with_name("step-000004.tmp")
    shutil.copytree(_ckpt(run_dir), tmp)
    (tmp / "manifest.json").unlink()
    _assert_refused(run_dir, tmp, "uncommitted checkpoint (a '.tmp' directory")
