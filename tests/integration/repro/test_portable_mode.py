"""repro.mode across (simulated) machines (tests.integration.repro.machines): the same CPT
config on this machine and on an SSE4-only one. With repro.isa=baseline the checkpoints
are identical (`baton ckpt diff` exits 0); in native mode they differ, and the comparison
names the fingerprint differences that explain it. With the default repro.isa=avx2, this
machine and an AVX2-only one give identical checkpoints (the other CPU vendor: MKL's vendor
check is answered by baton's preload, tests/integration/repro/test_repro_and_fingerprint.py)."""
from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from ckpt.reproduce import compare_runs
from tests.conftest import run_baton
from tests.integration.repro.machines import AVX2_MACHINE, SSE_MACHINE

pytestmark = pytest.mark.slow
STEPS = 3
FINAL = f"cpt/checkpoints/step-{STEPS:06d}"


def _cpt(run_dir: Path, mode: str, env: dict) -> Path:
    """`mode`: native, or portable-<isa>."""
    repro = ["repro.mode=native"] if mode == "native" else ["repro.mode=portable", f"repro.isa={mode.split('-')[1]}"]
    run_baton("stage", "cpt", f"run.dir={run_dir}", *repro, f"stage.max_steps={STEPS}",
              f"stage.save_every={STEPS}", "stage.eval_every=1", "stage.eval_samples=8",
              "mlflow.enabled=false", env=env, check=True, timeout=300)
    return run_dir


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("machines")
    plan = [(mode, machine, env) for mode in ("portable-baseline", "native")
            for machine, env in (("here", {}), ("sse", SSE_MACHINE))]
    plan += [("portable-avx2", "here", {}), ("portable-avx2", "avx2", AVX2_MACHINE)]
    # Two at a time: each run is one single-threaded rank, and this machine has two cores.
    with ThreadPoolExecutor(2) as pool:
        done = {(mode, machine): pool.submit(_cpt, root / f"{mode}-{machine}", mode, env)
                for mode, machine, env in plan}
        return {key: future.result() for key, future in done.items()}


def _fingerprint(run_dir: Path) -> dict:
    return json.loads((run_dir / "cpt" / "environment.json").read_text())


def test_portable_baseline_gives_identical_checkpoints_on_both_machines(runs):
    here, other = runs[("portable-baseline", "here")], runs[("portable-baseline", "sse")]
    assert _fingerprint(here)["cpu_capability"] == _fingerprint(other)["cpu_capability"] == "DEFAULT"
    assert _fingerprint(other)["env"]["MKL_CBWR"] == "COMPATIBLE"
    # The other machine's MKL cap is still in its environment: MKL_CBWR overrides it.
    assert _fingerprint(other)["env"]["MKL_ENABLE_INSTRUCTIONS"] == "SSE4_2"
    proc = run_baton("ckpt", "diff", str(here / FINAL), str(other / FINAL))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "IDENTICAL" in proc.stdout


def test_portable_avx2_gives_identical_checkpoints_here_and_on_an_avx2_only_machine(runs):
    here, other = runs[("portable-avx2", "here")], runs[("portable-avx2", "avx2")]
    assert _fingerprint(here)["cpu_capability"] == _fingerprint(other)["cpu_capability"] == "AVX2"
    assert _fingerprint(here)["env"]["MKL_CBWR"] == "AVX2"
    assert _fingerprint(here)["libraries"]["mkl_branch"] == _fingerprint(other)["libraries"]["mkl_branch"] == "AVX2"
    proc = run_baton("ckpt", "diff", str(here / FINAL), str(other / FINAL))
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_native_mode_differs_and_the_fingerprints_say_why(runs):
    here, other = runs[("native", "here")], runs[("native", "sse")]
    proc = run_baton("ckpt", "diff", str(here / FINAL), str(other / FINAL))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "DIFFERENT" in proc.stdout
    assert "environment differences that can explain it: CPU capability" in proc.stdout
    verdict = compare_runs(here / "cpt" / "metrics.jsonl", other / "cpt" / "metrics.jsonl",
                           here / FINAL, other / FINAL, original_checkpoints=[here / FINAL],
                           rerun_checkpoints=[other / FINAL],
                           environments=(_fingerprint(here), _fingerprint(other)))
    assert not verdict.reproduced
    native = _fingerprint(here)["cpu_capability"]
    assert native in ("AVX2", "AVX512")
    assert f"CPU capability {native} → DEFAULT" in verdict.environment_differences
    assert "MKL_ENABLE_INSTRUCTIONS unset → SSE4_2" in verdict.environment_differences
    assert verdict.first_differing_checkpoint["step"] == STEPS
    assert "model" in verdict.first_differing_checkpoint["tensor"] or ".weight" in \
        verdict.first_differing_checkpoint["tensor"]
    assert "CPU capability" in verdict.summary()


def test_native_mode_leaves_the_machine_kernels_and_threads_as_they_are(runs):
    fingerprint = _fingerprint(runs[("native", "here")])
    assert fingerprint["repro_mode"] == "native" and "MKL_CBWR" not in fingerprint["env"]
    assert fingerprint["cpu_capability"] in ("AVX2", "AVX512")
