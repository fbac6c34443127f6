"""Launch a stage's worker processes with torchrun and read back their result.

SIGTERM to this process (or to the whole process group) reaches every worker, which
saves at its current micro-step and exits 0: the stage then reports `preempted`.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from baton.config.compose import as_dict, config_hash
from baton.config.schema import BatonConfig
from baton.errors import BatonError
from ckpt.layout import checkpoints_dir, stage_dir
from stages.run_files import RESULT

ERROR_FILE = "worker_error.json"


class StageFailed(BatonError):
    """`infrastructure`: the workers died without a Python error (killed, lost rendezvous);
    only those failures are worth retrying."""

    def __init__(self, stage: str, returncode: int, log_hint: str, infrastructure: bool = False):
        self.stage, self.returncode, self.infrastructure = stage, returncode, infrastructure
        kind = "infrastructure failure" if infrastructure else "error in the stage"
        super().__init__(f"stage '{stage}' workers exited with code {returncode} ({kind}); {log_hint}")


@dataclass
class StageResult:
    status: str
    step: int
    checkpoints: list[dict]
    checkpoints_dir: Path
    raw: dict


def worker_env() -> dict:
    env = dict(os.environ)
    try:
        import torch
        has_gpu = torch.cuda.is_available()
    except ImportError:
        has_gpu = False
    if not has_gpu:
        env.setdefault("DS_ACCELERATOR", "cpu")
    from stages.prebuild import extensions_dir

    # Built once by `make install` (stages.prebuild); private to this environment.
    env.setdefault("TORCH_EXTENSIONS_DIR", extensions_dir())
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    return env


def launch_stage(cfg: BatonConfig, model_dir: Path, parent: dict | None = None) -> StageResult:
    directory = stage_dir(cfg.run.dir, cfg.stage.name)
    directory.mkdir(parents=True, exist_ok=True)
    launch_file = directory / "launch.json"
    launch_file.write_text(json.dumps({
        "config": as_dict(cfg), "config_hash": config_hash(cfg), "model_dir": str(model_dir),
        "parent": parent}, indent=1))
    (directory / RESULT).unlink(missing_ok=True)
    error_file = directory / ERROR_FILE
    error_file.unlink(missing_ok=True)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={cfg.parallel.world_size}", "-m", "stages.worker", str(launch_file)]
    # torchrun's @record writes a worker's Python exception here; its absence after a
    # failure means the workers were killed or never met (infrastructure).
    process = subprocess.Popen(command, env={**worker_env(), "TORCHELASTIC_ERROR_FILE": str(error_file)})
    previous = signal.signal(signal.SIGTERM, lambda *_: process.send_signal(signal.SIGTERM))
    try:
        returncode = process.wait()
    finally:
        signal.signal(signal.SIGTERM, previous)
    result_path = directory / RESULT
    if not result_path.is_file():
        raise StageFailed(cfg.stage.name, returncode, "no result file was written; see the "
                          "worker output above", infrastructure=not error_file.exists())
    raw = json.loads(result_path.read_text())
    return StageResult(raw["status"], raw["progress"]["step"], raw["checkpoints"],
                       checkpoints_dir(cfg.run.dir, cfg.stage.name), raw)
