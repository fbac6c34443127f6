"""`baton ckpt reshard`: world size / ZeRO stage changes through DeepSpeed universal
checkpoints, checked for equivalence, then resumed with real DeepSpeed workers.

Two source runs (ws2/ZeRO-2 and ws1/ZeRO-1, 4 steps, saved at step 2) feed four
transforms. A resumed run's next-step loss is compared with the source run's own step 3:
the weights, moments and data are the same, but the gradient all-reduce sums the
micro-batches in another order at another world size, so equality is to 1e-4, not bits.
"""
from __future__ import annotations

import json
import shutil

import pytest

from ckpt.content_digest import content_digest_of
from tests.conftest import metrics, run_baton

N, K = 4, 2
NEXT_STEP_LOSS_TOLERANCE = 1e-4
TRANSFORMS = [  # (source layout, target layout)
    ((2, 2), (1, 2)),  # world size 2 -> 1
    ((1, 1), (2, 1)),  # world size 1 -> 2
    ((2, 2), (2, 1)),  # ZeRO 2 -> 1
    ((1, 1), (1, 3)),  # ZeRO 1 -> 3
]


def _layout(ws, zero):
    return [f"parallel.world_size={ws}", f"parallel.zero_stage={zero}"]


def _train(run_dir, ws, zero, *extra):
    return run_baton("stage", "cpt", f"run.dir={run_dir}", f"stage.max_steps={N}",
                     f"stage.save_every={K}", "stage.eval_every=100", *_layout(ws, zero), *extra,
                     check=True)


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """One straight 4-step run per source layout; their step-2 checkpoints are the SRCs."""
    made = {}
    for layout in sorted({src for src, _ in TRANSFORMS}):
        run_dir = tmp_path_factory.mktemp(f"src-ws{layout[0]}-zero{layout[1]}")
        _train(run_dir, *layout)
        made[layout] = run_dir
    return made


def _step_k(run_dir):
    return run_dir / "cpt" / "checkpoints" / f"step-{K:06d}"


@pytest.mark.slow
@pytest.mark.parametrize("source,target", TRANSFORMS,
                         ids=[f"ws{s[0]}z{s[1]}-to-ws{t[0]}z{t[1]}" for s, t in TRANSFORMS])
def test_resharded_checkpoint_is_equivalent_and_resumes_at_the_target_layout(
        tmp_path, sources, source, target):
    src, dst = _step_k(sources[source]), tmp_path / "resharded"
    proc = run_baton("ckpt", "reshard", str(src), str(dst), *_layout(*target), "--json", check=True)
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    eq = result["equivalence"]
    assert eq["passed"], eq
    assert eq["max_abs_logit_diff"] <= eq["tolerance"] == 1e-6
    assert eq["optimizer_moments"]["carried"]
    assert eq["optimizer_moments"]["max_abs_diff_exp_avg_sq"] == 0.0
    assert result["target_parallel"] == dict(zip(("world_size", "zero_stage"), target))
    assert result["input_manifest_sha256"] == _sha256(src / "manifest.json")
    assert result["output_manifest_sha256"] == _sha256(dst / "manifest.json")
    assert result["input_content_digest"] == content_digest_of(src)
    assert result["output_content_digest"] == content_digest_of(dst)
    assert result["input_content_digest"] != result["output_content_digest"]  # another layout
    assert not any(p.name.endswith(".reshard") for p in tmp_path.iterdir())

    manifest = json.loads((dst / "manifest.json").read_text())
    assert manifest["parallel"]["world_size"] == target[0]
    assert manifest["extra"]["reshard"]["source_parallel"]["zero_stage"] == source[1]
    assert run_baton("ckpt", "verify", str(dst)).returncode == 0

    resumed = tmp_path / "resumed"
    _train(resumed, *target, f"resume={dst}")
    straight, after = metrics(sources[source], "cpt"), metrics(resumed, "cpt")
    assert sorted(after) == [K + 1, N]
    assert abs(after[K + 1]["loss"] - straight[K + 1]["loss"]) <= NEXT_STEP_LOSS_TOLERANCE


def _sha256(path):
    import hashlib
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.slow
def test_a_corrupted_source_is_refused_before_conversion(tmp_path, sources):
    src = tmp_path / "step-000002"
    shutil.copytree(_step_k(sources[(2, 2)]), src)
    optim = next(src.glob("*optim_states.pt"))
    data = bytearray(optim.read_bytes())
    data[-100] ^= 0xFF
    optim.write_bytes(bytes(data))
    dst = tmp_path / "dst"
    proc = run_baton("ckpt", "reshard", str(src), str(dst), *_layout(1, 2))
    assert proc.returncode == 2
    assert "checkpoint is damaged; nothing was loaded" in proc.stderr
    assert f"checksum mismatch in {optim.name}" in proc.stderr
    assert not dst.exists() and not (tmp_path / ".dst.reshard").exists()


@pytest.mark.slow
def test_resharding_to_the_same_layout_writes_nothing_and_says_so(tmp_path, sources):
    dst = tmp_path / "dst"
    proc = run_baton("ckpt", "reshard", str(_step_k(sources[(2, 2)])), str(dst), *_layout(2, 2))
    assert proc.returncode == 2
    assert "already has world_size=2 zero_stage=2; nothing to reshard" in proc.stderr
    assert not dst.exists()
