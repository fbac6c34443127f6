"""CPT then SFT from CPT's latest committed checkpoint (weights carried, optimizer reset)."""
from __future__ import annotations

from baton.commands.stage import prepare
from ckpt.layout import checkpoints_dir, read_latest
from stages.launch import launch_stage


def run_sequence(overrides: list[str], stages: list[str]) -> int:
    previous = None
    for name in stages:
        extra = [f"stage.init_from={previous}"] if previous is not None else []
        cfg, model_dir = prepare([*overrides, *extra], name)
        result = launch_stage(cfg, model_dir, {"init_from": previous} if previous else None)
        latest = read_latest(checkpoints_dir(cfg.run.dir, name))
        previous = str(latest) if latest else None
        print(f"[baton] {name}: {result.status} at step {result.step}; checkpoints in "
              f"{result.checkpoints_dir}; latest -> {previous}", flush=True)
        if result.status != "completed":
            return 1
    return 0
