"""Shared helpers: run the real `baton` command line in a subprocess."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


# For `env=`: a run on Prefect's temporary API under its run dir, as `baton run` starts
# without a server, not on the test process's server (tests.integration.prefect_api).
EPHEMERAL_PREFECT = {"PREFECT_API_URL": None, "PREFECT_HOME": None}


def environment(changes: dict | None = None) -> dict:
    """This process's environment with `changes`; a None value unsets the variable."""
    merged = {**os.environ, **(changes or {})}
    return {name: value for name, value in merged.items() if value is not None}


def run_baton(*args: str, check: bool = False, timeout: int = 600, env: dict | None = None,
              **popen) -> subprocess.CompletedProcess:
    """`python -m baton.cli ARGS` with captured output (text); `env`: see `environment`."""
    full_env = environment(env)
    proc = subprocess.run([sys.executable, "-m", "baton.cli", *args], cwd=REPO, text=True,
                          capture_output=True, timeout=timeout, env=full_env, **popen)
    if check and proc.returncode != 0:
        raise AssertionError(f"baton {' '.join(args)} exited {proc.returncode}\n"
                             f"stdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}")
    return proc


def metrics(run_dir: Path, stage: str) -> dict[int, dict]:
    """Per-step training records of a stage, keyed by step (later lines win)."""
    lines = (run_dir / stage / "metrics.jsonl").read_text().splitlines()
    return {rec["step"]: rec for rec in map(json.loads, lines)}


# The longest modules, longest first (durations of a full run on 2 cores). With
# `-n 2 --dist loadfile` (make test) a worker takes whole modules in collection order, so
# starting with these keeps one worker from running a 10-minute module alone at the end
# (`--no-loadscope-reorder`: xdist would otherwise order modules by their number of tests).
LONGEST_FIRST = [
    "tests/integration/ckpt/test_resume_is_bit_exact.py",
    "tests/integration/flows/test_pipeline_and_rerun.py",
    "tests/integration/stages/test_own_model_and_data.py",
    "tests/integration/ckpt/test_random_kills_during_saves.py",
    "tests/integration/rl/test_rl_roles.py",
    "tests/integration/flows/test_selection_study.py",
    "tests/integration/stages/test_rm_and_rl.py",
    "tests/integration/stages/test_two_nodes.py",
    "tests/integration/ckpt/test_adopt_and_export.py",
    "tests/integration/ckpt/test_reshard.py",
    "tests/integration/test_clear_errors.py",
    "tests/integration/repro/test_rerun_names_the_difference.py",
    "tests/integration/ckpt/test_tiers_restore.py",
    "tests/integration/ckpt/test_malicious_checkpoints.py",
    "tests/integration/ckpt/test_selective_saves.py",
    "tests/integration/ckpt/test_crash_and_bad_input.py",
]


def pytest_collection_modifyitems(items):
    def weight(item) -> int:
        path = item.path.relative_to(REPO).as_posix()
        return LONGEST_FIRST.index(path) if path in LONGEST_FIRST else len(LONGEST_FIRST)
    items.sort(key=weight)  # stable: every other module keeps its place and test order


@pytest.fixture
def baton():
    return run_baton


@pytest.fixture(scope="module")
def ray_address():
    """One loopback-only Ray instance for the module (`rl.ray.address` for its RL stages),
    owned and stopped by this process: a stage that starts its own pays about 10 s here."""
    from stages.rl import cluster

    handle = cluster.start(None, "baton-tests")
    yield handle.address
    cluster.stop()


@pytest.fixture(scope="session")
def sft_and_rm(tmp_path_factory):
    """A short SFT run and an RM trained from it, shared by every RL test module:
    (run dir, SFT checkpoint, the RM run's CompletedProcess)."""
    home = tmp_path_factory.mktemp("sft-rm")
    run_baton("stage", "sft", f"run.dir={home}", "stage.max_steps=4", "stage.save_every=4",
              "stage.eval_every=4", "stage.eval_samples=8", check=True)
    sft = home / "sft" / "checkpoints" / "step-000004"
    rm = run_baton("stage", "rm", f"run.dir={home}", f"stage.init_from={sft}",
                   "stage.max_steps=4", "stage.save_every=4", "stage.eval_every=4",
                   "stage.eval_samples=16", check=True)
    return home, sft, rm
