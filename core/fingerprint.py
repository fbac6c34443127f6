"""The environment a stage ran in, as far as it can change the numbers it produced.

Recorded with every stage run (rank 0 writes it into the stage directory, lineage and
MLflow store it), and compared by `baton rerun`: when a re-run diverges, the differences
listed here are the first suspects ("CPU capability AVX512 → AVX2; MKL_CBWR unset").

Only allow-listed environment variables are recorded (those that change kernels, threads
or collective algorithms), so no credential can end up in the record.
"""
from __future__ import annotations

import os
import platform
import re
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from core import mkl_preload
from core.mkl_branch import effective_branch

REPO = Path(__file__).resolve().parents[1]
# /proc/cpuinfo flags that select different kernels in MKL, oneDNN or ATen.
ISA_FLAGS = ("sse4_1", "sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl",
             "avx512dq", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16",
             "amx_int8", "avx_vnni")
ENV_PREFIXES = ("MKL_", "OMP_", "KMP_", "ATEN_", "ONEDNN_", "DNNL_", "CUBLAS_", "NCCL_ALGO",
                "NCCL_PROTO", "CUDA_VISIBLE_DEVICES", "PYTHONHASHSEED", "TORCH_DETERMINISTIC")
PACKAGES = ("torch", "deepspeed", "transformers", "numpy", "baton")


def code_version() -> str:
    """The source tree's commit, `-dirty` when tracked files differ from it."""
    try:
        out = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return out.stdout.strip() + ("-dirty" if dirty else "") if out.returncode == 0 else "unknown"
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"


def _cpu() -> dict:
    info = {"model": platform.processor() or "unknown", "flags": [], "logical_cores": os.cpu_count()}
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return info
    model = re.search(r"^model name\s*:\s*(.+)$", text, re.M)
    flags = re.search(r"^flags\s*:\s*(.+)$", text, re.M)
    info["model"] = model.group(1).strip() if model else info["model"]
    present = set(flags.group(1).split()) if flags else set()
    info["flags"] = [flag for flag in ISA_FLAGS if flag in present]
    return info


def _libraries(torch) -> dict:
    shown = torch.__config__.show()
    mkl = re.search(r"Math Kernel Library Version (\S+)", shown)
    onednn = re.search(r"MKL-DNN (v[\d.]+)", shown)
    blas = re.search(r"BLAS_INFO=(\w+)", shown)
    return {"blas": blas.group(1) if blas else "unknown", "mkl": mkl.group(1) if mkl else None,
            "mkl_branch": effective_branch(), "sqrt": mkl_preload.kind(),
            "onednn": onednn.group(1) if onednn else None}


def library_versions() -> dict:
    """Python's and each of PACKAGES' installed version (None when absent), read from
    package metadata, so nothing is imported for it."""
    found = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = None
    return found


def collect(repro_mode: str, config_hash: str | None) -> dict:
    """This process's fingerprint (torch must be importable; call it where the numbers are
    computed, after `core.repro` applied the mode). `config_hash`: the training config's
    (core.config.compose.training_config_hash: no run directory or store in it)."""
    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {
        "repro_mode": repro_mode, "cpu": _cpu(), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "libraries": _libraries(torch),
        "threads": {"intra_op": torch.get_num_threads(), "inter_op": torch.get_num_interop_threads()},
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "gpu": gpu, "cuda": torch.version.cuda, "versions": library_versions(),
        "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES)},
        "code": code_version(), "config_hash": config_hash, "platform": sys.platform,
    }


# What can explain a numeric divergence, most likely first: (label, path in the fingerprint).
_EXPLAINING = (
    ("repro mode", ("repro_mode",)), ("CPU capability", ("cpu_capability",)),
    ("MKL code path", ("libraries", "mkl_branch")), ("square root", ("libraries", "sqrt")),
    ("CPU model", ("cpu", "model")), ("ISA flags", ("cpu", "flags")),
    ("threads", ("threads", "intra_op")), ("inter-op threads", ("threads", "inter_op")),
    ("deterministic algorithms", ("deterministic_algorithms",)),
    ("BLAS", ("libraries", "blas")), ("MKL", ("libraries", "mkl")), ("oneDNN", ("libraries", "onednn")),
    ("GPU", ("gpu",)), ("CUDA", ("cuda",)),
)


def _at(fingerprint: dict, path: tuple):
    value = fingerprint
    for key in path:
        value = value.get(key) if isinstance(value, dict) else None
    return value


def _shown(value) -> str:
    if value is None:
        return "unset"
    if isinstance(value, list):
        return "[" + " ".join(value) + "]"
    return str(value)


def differences(original: dict | None, rerun: dict | None) -> list[str]:
    """What differs between two fingerprints, in words, the likeliest causes of a numeric
    divergence first: "CPU capability AVX512 → AVX2", "MKL_CBWR unset → COMPATIBLE"."""
    if not original or not rerun:
        return [f"no environment fingerprint recorded for the {'original' if not original else 're-run'}"]
    found = []
    for label, path in _EXPLAINING:
        a, b = _at(original, path), _at(rerun, path)
        if a != b:
            if isinstance(a, list) and isinstance(b, list):
                gone, new = [f for f in a if f not in b], [f for f in b if f not in a]
                found.append(f"{label} " + " ".join([f"-{f}" for f in gone] + [f"+{f}" for f in new]))
            else:
                found.append(f"{label} {_shown(a)} → {_shown(b)}")
    env_a, env_b = original.get("env", {}), rerun.get("env", {})
    for name in sorted(set(env_a) | set(env_b)):
        if env_a.get(name) != env_b.get(name):
            found.append(f"{name} {_shown(env_a.get(name))} → {_shown(env_b.get(name))}")
    versions_a, versions_b = original.get("versions", {}), rerun.get("versions", {})
    for name in sorted(set(versions_a) | set(versions_b)):
        if versions_a.get(name) != versions_b.get(name):
            found.append(f"{name} {_shown(versions_a.get(name))} → {_shown(versions_b.get(name))}")
    for label, key, width in (("code", "code", None), ("training config hash", "config_hash", 12)):
        if original.get(key) != rerun.get(key):
            found.append(f"{label} {_shown(original.get(key))[:width]} → {_shown(rerun.get(key))[:width]}")
    return found
