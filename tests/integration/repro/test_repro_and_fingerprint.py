"""repro.mode's environment and the fingerprint comparison `baton rerun` prints."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from core import fingerprint
from core.config import compose
from core.errors import ConfigError
from core.repro import LEVELS, process_env


def test_portable_pins_every_kernel_library_and_the_threads_native_pins_nothing():
    cfg = compose([])
    assert cfg.repro.mode == "portable" and cfg.repro.isa == "avx2"
    env = process_env(cfg.repro)
    assert env["MKL_CBWR"] == "AVX2" and env["ATEN_CPU_CAPABILITY"] == "avx2"
    assert env["ONEDNN_MAX_CPU_ISA"] == "AVX2"
    assert env["OMP_NUM_THREADS"] == env["MKL_NUM_THREADS"] == "1"
    env = process_env(compose(["repro.isa=baseline"]).repro)
    assert env["MKL_CBWR"] == "COMPATIBLE" and env["ATEN_CPU_CAPABILITY"] == "default"
    assert env["ONEDNN_MAX_CPU_ISA"] == "SSE41"
    assert process_env(compose(["repro.mode=native"]).repro) == {}


def test_bad_repro_settings_are_named():
    with pytest.raises(ConfigError) as caught:
        compose(["repro.mode=fast", "repro.threads=0", "repro.isa=avx512"])
    found = caught.value.problems if hasattr(caught.value, "problems") else str(caught.value).splitlines()
    found = [line.strip().lstrip("- ") for line in found]
    assert any(p.startswith("repro.mode='fast'") and "portable" in p for p in found)
    assert any(p.startswith("repro.threads=0") for p in found)
    assert any(p.startswith("repro.isa='avx512'") for p in found)


def test_a_worker_started_with_the_variables_runs_the_pinned_kernels():
    script = ("from core.config import compose; from core.repro import apply_in_process;"
              "import torch; cfg = compose(['repro.isa=baseline']); apply_in_process(cfg.repro);"
              "from core.mkl_branch import effective_branch; from core import mkl_preload;"
              "print(torch.backends.cpu.get_cpu_capability(), torch.get_num_threads(),"
              " torch.are_deterministic_algorithms_enabled(), effective_branch(), mkl_preload.kind())")
    env = {**process_env(compose(["repro.isa=baseline"]).repro), "PATH": "/usr/bin:/bin"}
    assert "_mkl_preload" in env["LD_PRELOAD"]
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                         check=True).stdout.split()
    assert out[-5:] == ["DEFAULT", "1", "True", "COMPATIBLE", "ieee"]


def test_square_roots_are_ieee_in_portable_mode_and_mkls_otherwise():
    """MKL's vector-math sqrt (COMPATIBLE branch: repro.isa=baseline) is off in the last
    bit for about one value in five, differently on Intel and AMD; portable mode replaces
    it. A process started without the replacement is refused, naming it."""
    values = ("import torch; v = torch.arange(1, 4097, dtype=torch.float32) * 0.0137;"
              "print(int((v.sqrt() != v.double().sqrt().float()).sum()))")
    baseline = compose(["repro.isa=baseline"]).repro
    env = {**LEVELS["baseline"][0], "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}
    mkl = subprocess.run([sys.executable, "-c", values], env=env, capture_output=True, text=True, check=True)
    assert int(mkl.stdout) > 0  # the wrongly rounded results the replacement exists for
    ieee = subprocess.run([sys.executable, "-c", values], env={**env, **process_env(baseline)},
                          capture_output=True, text=True, check=True)
    assert int(ieee.stdout) == 0
    refused = subprocess.run([sys.executable, "-c", "from core.config import compose;"
                              "from core.repro import apply_in_process;"
                              "apply_in_process(compose(['repro.isa=baseline']).repro)"],
                             env=env, capture_output=True, text=True)
    assert refused.returncode != 0 and "IeeeSqrtNotApplied" in refused.stderr
    assert "not loaded before torch" in refused.stderr


def test_mkl_runs_its_avx2_branch_on_any_vendor_with_the_preload_and_is_refused_without(tmp_path):
    """MKL grants its AVX2 branch only to a CPU it believes is Intel's. Here MKL is told it
    runs on another vendor's CPU (on an AMD machine, the truth): without baton's preload
    it falls back to its own dispatch and the process is refused by name; with the
    preload ahead (as baton starts every process), MKL runs the AVX2 branch."""
    from tests.integration.repro.machines import vendor_machine

    not_intel = vendor_machine(tmp_path, intel=False)["LD_PRELOAD"]
    script = ("from core.config import compose; from core.repro import apply_in_process;"
              "apply_in_process(compose([]).repro); from core.mkl_branch import effective_branch;"
              "print(effective_branch())")
    env = {**process_env(compose([]).repro), "PATH": "/usr/bin:/bin"}
    refused = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                             env={**env, "LD_PRELOAD": not_intel})
    assert refused.returncode != 0
    assert "MklBranchNotApplied" in refused.stderr and "expected AVX2" in refused.stderr
    assert "MKL runs its AUTO code path" in refused.stderr and "vendor check" in refused.stderr
    granted = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                             env={**env, "LD_PRELOAD": f"{env['LD_PRELOAD']} {not_intel}"})
    assert granted.stdout.split()[-1] == "AVX2"


def test_a_process_that_already_dispatched_natively_is_refused():
    script = ("import torch; torch.ones(3).sum();"  # dispatches with the native capability
              "from core.config import compose; from core.repro import pin_this_process;"
              "pin_this_process(compose(['repro.isa=baseline']).repro)")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin"})
    assert proc.returncode != 0
    assert "ReproModeNotApplied" in proc.stderr and "expected DEFAULT" in proc.stderr


def _fp(**changes) -> dict:
    base = {"repro_mode": "native", "cpu_capability": "AVX512",
            "cpu": {"model": "Intel Xeon", "flags": ["avx2", "avx512f"]},
            "threads": {"intra_op": 1, "inter_op": 2}, "deterministic_algorithms": True,
            "libraries": {"blas": "mkl", "mkl": "2024.2", "mkl_branch": "AVX2", "onednn": "v3.12.0"},
            "env": {"OMP_NUM_THREADS": "1"}, "versions": {"torch": "2.13.0"},
            "code": "abc123", "config_hash": "h1", "gpu": None, "cuda": None}
    for key, value in changes.items():
        base[key] = value
    return base


def test_differences_name_the_likeliest_cause_first_in_words():
    other = _fp(cpu_capability="AVX2", cpu={"model": "AMD EPYC", "flags": ["avx2"]},
                env={"OMP_NUM_THREADS": "1", "MKL_CBWR": "COMPATIBLE"},
                libraries={"blas": "mkl", "mkl": "2024.2", "mkl_branch": "AUTO", "onednn": "v3.12.0"})
    found = fingerprint.differences(_fp(), other)
    assert found[0] == "CPU capability AVX512 → AVX2"
    assert found[1] == "MKL code path AVX2 → AUTO"
    assert "CPU model Intel Xeon → AMD EPYC" in found
    assert "ISA flags -avx512f" in found
    assert "MKL_CBWR unset → COMPATIBLE" in found
    assert fingerprint.differences(_fp(), _fp()) == []
    assert fingerprint.differences(None, _fp()) == ["no environment fingerprint recorded for the original"]


def test_the_fingerprint_of_this_process_has_what_the_issue_lists():
    found = fingerprint.collect("native", "hash")
    assert found["cpu"]["model"] and found["cpu_capability"] in ("DEFAULT", "AVX2", "AVX512")
    assert found["libraries"]["blas"] and found["threads"]["intra_op"] >= 1
    assert {"torch", "deepspeed", "transformers", "python"} <= set(found["versions"])
    assert found["code"] and found["config_hash"] == "hash"
    assert all(k.startswith(fingerprint.ENV_PREFIXES) for k in found["env"])


def test_the_fingerprint_config_hash_ignores_where_a_run_writes_not_what_it_computes():
    from core.config.compose import training_config_hash

    here, there = compose(["run.dir=/tmp/a"]), compose(["run.dir=/tmp/b", "resume=latest"])
    assert training_config_hash(here) == training_config_hash(there)
    assert training_config_hash(here) != training_config_hash(compose(["run.dir=/tmp/a", "seed=7"]))


def test_every_worker_starts_with_a_fixed_string_hash_seed_and_the_mode_pinning():
    from stages.worker_env import worker_env

    cfg = compose([])
    env = worker_env(cfg.repro)
    # Set iteration order decides the order torch.save numbers storages in (same values,
    # other bytes, another content digest) unless the hash seed is fixed.
    assert env["PYTHONHASHSEED"] == "0"
    assert env["MKL_CBWR"] == "AVX2" and env["ATEN_CPU_CAPABILITY"] == "avx2"
    # Native leaves the kernel variables as this process has them.
    assert worker_env(compose(["repro.mode=native"]).repro).get("MKL_CBWR") == os.environ.get("MKL_CBWR")
