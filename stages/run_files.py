"""What a stage run leaves beside its checkpoints (rank 0 only): metrics.jsonl, log
lines, result.json that the launcher and the flow read back."""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from core.fingerprint import library_versions

METRICS, RESULT, ENVIRONMENT = "metrics.jsonl", "result.json", "environment.json"
BASIC = ("step", "loss", "lr", "tokens", "samples", "seconds", "data_seconds")


class RunFiles:
    def __init__(self, directory: Path, writer: bool):
        self.directory, self.writer = Path(directory), writer
        self._t_last = time.time()
        self.fingerprint: dict | None = None
        if writer:
            self.directory.mkdir(parents=True, exist_ok=True)

    def environment(self, fingerprint: dict) -> None:
        """The workers' environment fingerprint (core.fingerprint): environment.json, and
        every checkpoint's meta.json."""
        self.fingerprint = fingerprint
        if self.writer:
            (self.directory / ENVIRONMENT).write_text(json.dumps(fingerprint, indent=2, sort_keys=True))

    def log(self, line: str) -> None:
        if self.writer:
            print(f"[baton] {line}", flush=True)

    def evaluation(self, step: int, metrics: dict, stage: str) -> None:
        """An evaluation outside a training step (step 0: the starting point)."""
        if not self.writer:
            return
        with open(self.directory / METRICS, "a") as handle:
            handle.write(json.dumps({"step": step, **metrics}) + "\n")
        print(f"[{stage}] step {step} (start) " + " ".join(f"{k} {v:.4f}" for k, v in metrics.items()),
              flush=True)

    def step(self, record: dict, stage: str, max_steps: int) -> None:
        if not self.writer:
            return
        now = time.time()
        record = {**record, "seconds": round(now - self._t_last, 3)}
        self._t_last = now
        with open(self.directory / METRICS, "a") as handle:
            handle.write(json.dumps(record) + "\n")
        # Objective metrics (RL: reward, kl, entropy, ...) and evaluations follow the basics.
        evals = " ".join(f"{k} {v:.4f}" for k, v in record.items()
                         if k not in BASIC and isinstance(v, float))
        print(f"[{stage}] step {record['step']}/{max_steps} loss {record['loss']:.4f} "
              f"lr {record['lr']:.2e} tokens {record['tokens']} {record['seconds']:.2f}s {evals}",
              flush=True)

    def meta(self, launch: dict, identity: dict, parallel: dict, model_files: str | None = None) -> dict:
        """`model_files`: stages.model.model_files_digest of the model directory, which lets
        a resume skip recomputing `identity` (ckpt.compat.check_resumable)."""
        return {"config": launch["config"], "config_hash": launch["config_hash"],
                "model": identity, "model_files": model_files, "model_dir": launch["model_dir"],
                "parallel": parallel,
                "versions": library_versions(), "parent": launch.get("parent"),
                "argv": sys.argv, "environment": self.fingerprint,
                # The data plan (stages.data); the sampler's position is data.json.
                "data_plan": launch.get("data_plan")}

    def result(self, status: str, progress, saved: list[dict], seconds: float,
               init_from: dict | None = None, tier_checkpoints: list | None = None) -> None:
        """`init_from`: the new/dropped parameters reported when stage.init_from was loaded.
        `tier_checkpoints`: saves kept only in the memory/peer tiers (ckpt.tiers)."""
        if not self.writer:
            return
        payload = {"status": status, "progress": progress.state_dict(), "checkpoints": saved,
                   "seconds": round(seconds, 2), "init_from": init_from,
                   "tier_checkpoints": tier_checkpoints or []}
        tmp = self.directory / (RESULT + ".tmp")
        tmp.write_text(json.dumps(payload, indent=1))
        tmp.replace(self.directory / RESULT)
