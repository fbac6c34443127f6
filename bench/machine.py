"""What the numbers were measured on."""
from __future__ import annotations

import os
import platform
from importlib import metadata
from pathlib import Path

PACKAGES = ("torch", "deepspeed", "transformers", "numpy", "datasets")


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def memory_bytes() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def filesystem(path: Path) -> dict:
    """The mount holding `path` (longest mount point that contains it)."""
    best = {"mount": "/", "type": "unknown", "device": "unknown"}
    try:
        resolved = str(path.resolve())
        for line in Path("/proc/mounts").read_text().splitlines():
            device, mount, kind = line.split()[:3]
            inside = resolved == mount or resolved.startswith(mount.rstrip("/") + "/")
            if inside and len(mount) >= len(best["mount"]):
                best = {"mount": mount, "type": kind, "device": device}
    except OSError:
        pass
    return best


def machine_info(workdir: Path) -> dict:
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return {"cpu_model": cpu_model(), "cores": os.cpu_count(), "memory_bytes": memory_bytes(),
            "python": platform.python_version(), "kernel": platform.release(),
            "filesystem": filesystem(workdir), **{f"{k}_version": v for k, v in versions.items()}}
