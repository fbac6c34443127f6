"""A checkpoint file replaced by a malicious pickle, its manifest re-checksummed to match,
never runs: every command refuses it by name, and DeepSpeed's own helpers run under a
forced weights_only load.

The payload's `__reduce__` creates a marker file when unpickled; it is saved with
torch.save inside the real file's state dict, so it looks like a checkpoint file. Two
real runs (ZeRO-0 at world size 1; ZeRO-3 at world size 2) give the kinds of file: model
states, optimizer states, ZeRO-3 model shards; a universal folder is converted from the
ZeRO-3 one. The first test shows the payload does run when DeepSpeed loads it unprotected.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
from argparse import Namespace
from pathlib import Path

import pytest
import torch

from ckpt import safe_load
from ckpt.errors import CorruptCheckpoint, UnsafeCheckpoint
from tests.conftest import REPO, run_baton

pytestmark = pytest.mark.slow

STEP = "step-000002"
REFUSAL = "contains objects outside the allow-list of safe types (builtins.exec)"
KEY_ENV = "BATON_TEST_SIGNING_KEY"
KINDS = {  # kind of file -> (run, file)
    "model-states": ("z0", "mp_rank_00_model_states.pt"),
    "optimizer-states": ("z3", "zero_pp_rank_1_mp_rank_00_optim_states.pt"),
    "zero3-model-shard": ("z3", "zero_pp_rank_0_mp_rank_00_model_states.pt"),
}
LAYOUTS = {"z0": ("parallel.world_size=1", "parallel.zero_stage=0"),
           "z3": ("parallel.world_size=2", "parallel.zero_stage=3")}


class Payload:
    """Unpickled by anything but a weights_only load, it creates `marker`."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return exec, (f"open({self.marker!r}, 'w').close()",)


def _train(run_dir: Path, layout: str, *extra: str) -> None:
    run_baton("stage", "cpt", f"run.dir={run_dir}", "stage.max_steps=2", "stage.save_every=2",
              "stage.eval_every=100", *LAYOUTS[layout], *extra, check=True)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    made = {}
    for layout in LAYOUTS:
        made[layout] = tmp_path_factory.mktemp(layout)
        _train(made[layout], layout)
    return made


def _ckpt(run_dir: Path) -> Path:
    return run_dir / "cpt" / "checkpoints" / STEP


def _rechecksum(ckpt: Path, rel: str) -> None:
    """What an attacker with write access does: make the manifest match the new bytes."""
    path = ckpt / "manifest.json"
    manifest = json.loads(path.read_text())
    data = (ckpt / rel).read_bytes()
    manifest["files"][rel] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    path.write_text(json.dumps(manifest, indent=2))


def _plant(path: Path, marker: Path) -> None:
    """The real file's content plus the payload, saved as torch.save would."""
    states = safe_load.load_file(path)
    if not isinstance(states, dict):
        states = {"param": states}
    states["__evil__"] = Payload(marker)
    torch.save(states, path)


@pytest.fixture
def poisoned(runs, tmp_path):
    """poisoned(kind) -> (run dir copy, checkpoint, file name, marker)."""
    def make(kind: str):
        layout, rel = KINDS[kind]
        run_dir = tmp_path / f"run-{kind}"
        shutil.copytree(runs[layout], run_dir)
        marker = tmp_path / f"PWNED-{kind}"
        _plant(_ckpt(run_dir) / rel, marker)
        _rechecksum(_ckpt(run_dir), rel)
        return run_dir, _ckpt(run_dir), rel, marker
    return make


def _refused(proc, marker: Path, rel: str, code: int = 2) -> None:
    assert proc.returncode == code, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"{rel}: {REFUSAL}" in proc.stderr, proc.stderr[-3000:]
    assert "it was not loaded and nothing in it was executed" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not marker.exists(), "the payload ran"


def _tree(path: Path) -> dict:
    return {p.relative_to(path).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(path.rglob("*")) if p.is_file()}


def test_the_payload_runs_when_deepspeed_unpickles_it_unprotected(poisoned):
    """The suite can fail: DeepSpeed's zero_to_fp32 (weights_only=False) executes it."""
    _, ckpt, _, marker = poisoned("optimizer-states")
    code = ("import sys; from deepspeed.utils.zero_to_fp32 import "
            "get_fp32_state_dict_from_zero_checkpoint as g; g(sys.argv[1], tag=sys.argv[2])")
    env = {k: v for k, v in os.environ.items() if k != safe_load.FORCE_ENV}
    subprocess.run([sys.executable, "-c", code, str(ckpt.parent), ckpt.name], cwd=REPO, env=env,
                   capture_output=True, timeout=300)
    assert marker.exists()


@pytest.mark.parametrize("kind", KINDS)
def test_verify_names_the_hostile_file_without_unpickling_it(poisoned, kind):
    _, ckpt, rel, marker = poisoned(kind)
    proc = run_baton("ckpt", "verify", str(ckpt))
    _refused(proc, marker, rel, code=1)
    assert proc.stderr.startswith("FAILED ") and "checksums match" not in proc.stdout


def test_inspect_shows_the_checkpoint_without_deserializing_any_pickle(poisoned):
    _, ckpt, _, marker = poisoned("model-states")
    proc = run_baton("ckpt", "inspect", str(ckpt), "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["step"] == 2
    assert not marker.exists()


def test_diff_could_not_compare_and_says_which_file(runs, poisoned):
    _, ckpt, rel, marker = poisoned("model-states")
    _refused(run_baton("ckpt", "diff", str(ckpt), str(_ckpt(runs["z0"]))), marker, rel)


@pytest.mark.parametrize("kind", ["model-states", "zero3-model-shard"])
def test_resume_is_refused_before_any_worker_starts(poisoned, kind):
    run_dir, ckpt, rel, marker = poisoned(kind)
    before = _tree(run_dir / "cpt" / "checkpoints")
    proc = run_baton("stage", "cpt", f"run.dir={run_dir}", f"resume={ckpt}", "stage.max_steps=4",
                     *LAYOUTS[KINDS[kind][0]])
    _refused(proc, marker, rel)
    assert _tree(run_dir / "cpt" / "checkpoints") == before


def test_reshard_is_refused_and_writes_nothing(poisoned, tmp_path):
    _, ckpt, rel, marker = poisoned("optimizer-states")
    dst = tmp_path / "dst"
    proc = run_baton("ckpt", "reshard", str(ckpt), str(dst), "parallel.world_size=1",
                     "parallel.zero_stage=1")
    _refused(proc, marker, rel)
    assert not dst.exists() and not (tmp_path / ".dst.reshard").exists()


def test_init_from_a_poisoned_zero3_checkpoint_is_refused(poisoned, tmp_path):
    _, ckpt, rel, marker = poisoned("zero3-model-shard")
    proc = run_baton("stage", "sft", f"run.dir={tmp_path / 'sft'}", f"stage.init_from={ckpt}",
                     "stage.max_steps=1")
    _refused(proc, marker, rel)
    assert not (tmp_path / "sft" / "sft" / "checkpoints").exists()


@pytest.mark.parametrize("kind", ["model-states", "zero3-model-shard"])
def test_handoff_candidate_evaluation_refuses_the_checkpoint(poisoned, kind, tmp_path):
    from core.config.compose import compose
    from handoff.candidates import evaluate_candidates

    _, ckpt, rel, marker = poisoned(kind)
    model_dir = json.loads((ckpt / "meta.json").read_text())["model_dir"]
    target = compose(["stage=sft", f"run.dir={tmp_path / 'next'}"])
    with pytest.raises(UnsafeCheckpoint) as err:
        evaluate_candidates([(str(ckpt), 2)], "cpt", model_dir, target,
                            target.pipeline.handoffs["cpt_sft"].selection)
    assert str(err.value).startswith(f"{ckpt / rel}: {REFUSAL}")
    assert not marker.exists()


def test_deepspeed_helpers_refuse_the_payload_even_when_nothing_checked_first(poisoned, tmp_path):
    """Bypass verify and the checked reader: ds_to_universal and zero_to_fp32 on the
    poisoned directory itself, under the forced weights_only load."""
    from deepspeed.checkpoint import ds_to_universal
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    _, ckpt, _, marker = poisoned("optimizer-states")
    args = Namespace(input_folder=str(ckpt), output_folder=str(tmp_path / "universal"),
                     num_extract_workers=1, num_merge_workers=1, keep_temp_folder=False,
                     strict=True, inject_missing_state=True)
    for helper in (lambda: ds_to_universal.main(args),
                   lambda: get_fp32_state_dict_from_zero_checkpoint(str(ckpt.parent), tag=ckpt.name)):
        with pytest.raises(UnsafeCheckpoint, match=r"outside the allow-list of safe types \(exec\)"):
            with safe_load.forced_safe_load(ckpt):
                helper()
    assert not marker.exists() and not safe_load.forced()


def test_conversion_to_universal_reads_only_checked_bytes(poisoned, tmp_path):
    from ckpt import universal

    _, ckpt, rel, marker = poisoned("optimizer-states")
    with pytest.raises(UnsafeCheckpoint) as err:
        universal.to_universal(ckpt, tmp_path / "universal" / STEP, 3, io.StringIO())
    assert str(err.value).startswith(f"{ckpt / rel}: {REFUSAL}")
    assert not marker.exists()


def test_a_poisoned_universal_checkpoint_file_is_refused(runs, tmp_path):
    from ckpt import universal

    folder = universal.to_universal(_ckpt(runs["z3"]), tmp_path / "universal" / STEP, 3,
                                    io.StringIO())
    written = universal.fingerprint(folder)
    target, marker = sorted(folder.glob("zero/*/exp_avg.pt"))[0], tmp_path / "PWNED-universal"
    _plant(target, marker)
    with pytest.raises(CorruptCheckpoint, match=f"{target.relative_to(folder)} changed since conversion"):
        universal.check_fingerprint(folder, written)  # the reshard worker's first check
    with pytest.raises(UnsafeCheckpoint, match=REFUSAL.replace("(", r"\(").replace(")", r"\)")):
        universal.read_states(folder)
    with pytest.raises(UnsafeCheckpoint, match=r"\(exec\)"):
        with safe_load.forced_safe_load(target):  # as DeepSpeed's universal loader calls it
            torch.load(target, weights_only=False)
    with safe_load.forced_safe_load(target):
        child = subprocess.run(  # a torchrun worker inherits the forcing
            [sys.executable, "-c", "import sys, torch; torch.load(sys.argv[1], weights_only=False)",
             str(target)], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert child.returncode != 0 and "Weights only load failed" in child.stderr
    assert not marker.exists()


def test_the_allow_list_names_match_the_deepspeed_classes():
    assert safe_load.allowed_names() == sorted(safe_load.DEEPSPEED_ALLOWED)


def test_adopting_a_poisoned_deepspeed_checkpoint_is_refused(poisoned, tmp_path):
    _, ckpt, rel, marker = poisoned("zero3-model-shard")
    foreign = tmp_path / "foreign" / "global_step2"
    foreign.mkdir(parents=True)
    for path in ckpt.glob("*_states.pt"):
        shutil.copy(path, foreign / path.name)
    proc = run_baton("ckpt", "adopt", str(foreign), f"run.dir={tmp_path / 'home'}")
    _refused(proc, marker, rel)
    assert not (tmp_path / "home" / "adopted").exists() or not any((tmp_path / "home" / "adopted").iterdir())


# -- signed manifests ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def signed(tmp_path_factory):
    key = {KEY_ENV: hashlib.sha256(b"baton test key").hexdigest()}
    run_dir = tmp_path_factory.mktemp("signed")
    run_baton("stage", "cpt", f"run.dir={run_dir}", "stage.max_steps=2", "stage.save_every=2",
              "stage.eval_every=100", f"ckpt.signing_key_env={KEY_ENV}", env=key, check=True)
    return run_dir, key


def _verify(ckpt: Path, env: dict | None, *extra: str):
    return run_baton("ckpt", "verify", str(ckpt), *extra, env=env)


def test_a_signed_checkpoint_verifies_with_its_key_and_the_key_is_written_nowhere(signed, runs):
    run_dir, key = signed
    with_key = f"ckpt.signing_key_env={KEY_ENV}"
    assert json.loads((_ckpt(run_dir) / "manifest.json").read_text())["signature"]["alg"] == "hmac-sha256"
    assert _verify(_ckpt(run_dir), key, with_key).returncode == 0
    assert _verify(_ckpt(run_dir), None).returncode == 0  # no key configured: not checked
    unsigned = _verify(_ckpt(runs["z0"]), key, with_key)
    assert unsigned.returncode == 1 and "manifest.json is not signed" in unsigned.stderr
    leaked = [p for p in run_dir.rglob("*") if p.is_file() and key[KEY_ENV].encode() in p.read_bytes()]
    assert leaked == []


def test_with_signing_on_a_rechecksummed_payload_is_refused_before_anything_is_read(signed, tmp_path):
    run_dir, key = signed
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    marker, rel = tmp_path / "PWNED-signed", "mp_rank_00_model_states.pt"
    _plant(_ckpt(copy) / rel, marker)
    _rechecksum(_ckpt(copy), rel)
    (_ckpt(copy) / "rng" / "rank-00000.json").unlink()  # were any file read: "missing file"
    expected = "manifest.json has a signature that does not match its content"
    proc = _verify(_ckpt(copy), key, f"ckpt.signing_key_env={KEY_ENV}")
    assert proc.returncode == 1 and expected in proc.stderr and "missing file" not in proc.stderr
    resume = run_baton("stage", "cpt", f"run.dir={copy}", f"resume={_ckpt(copy)}", "stage.max_steps=4",
                       f"ckpt.signing_key_env={KEY_ENV}", env=key)
    assert resume.returncode == 2 and expected in resume.stderr and "Traceback" not in resume.stderr
    assert not marker.exists()


def test_a_resharded_signed_checkpoint_is_signed_too(signed, tmp_path):
    run_dir, key = signed
    dst = tmp_path / "dst"
    run_baton("ckpt", "reshard", str(_ckpt(run_dir)), str(dst), "parallel.zero_stage=1",
              f"ckpt.signing_key_env={KEY_ENV}", "--json", env=key, check=True)
    assert json.loads((dst / "manifest.json").read_text())["signature"]["alg"] == "hmac-sha256"
    assert _verify(dst, key, f"ckpt.signing_key_env={KEY_ENV}").returncode == 0
    other = {KEY_ENV: "another key"}
    assert _verify(dst, other, f"ckpt.signing_key_env={KEY_ENV}").returncode == 1
