"""`baton stage cpt|sft [overrides]`: run one stage's DeepSpeed workers."""
from __future__ import annotations

import contextlib

from core.errors import ConfigError


def add_arguments(parser) -> None:
    parser.add_argument("name", choices=["cpt", "sft", "rm", "rl"], help="stage to run")


def prepare(overrides: list[str], name: str, locks: contextlib.ExitStack | None = None,
            own_process: bool = False):
    """Compose + validate the config and run the stage's pre-launch checks (see
    stages.prepare) before any worker starts."""
    from core.config import compose
    from stages.prepare import prepare_stage

    if any(o.startswith("stage.name=") for o in overrides):
        raise ConfigError(["stage.name is set by the command: use `baton stage NAME`"])
    cfg = compose([f"stage={name}", *overrides])
    if own_process:
        # Then the built-in model, where this process makes it, is made here, not in a child
        # (stages.model), which applies the in-process settings when it does: a launch that
        # computes nothing here skips their import of TorchInductor (1.3 s). Never in a
        # caller's process: the variables would leak into everything it starts later.
        from core.repro import apply_to_environ
        apply_to_environ(cfg.repro)
    return cfg, prepare_stage(cfg, name, locks)


def main(args) -> int:
    from stages.launch import launch_stage

    with contextlib.ExitStack() as locks:  # held until the workers are gone
        cfg, model_dir = prepare(args.overrides, args.name, locks, args.own_process)
        parent = {"init_from": cfg.stage.init_from} if cfg.stage.init_from else None
        result = launch_stage(cfg, model_dir, parent, inputs_checked=True)
    print(f"[baton] stage {args.name} {result.status} at step {result.step}; "
          f"checkpoints in {result.checkpoints_dir} (latest -> {result.checkpoints[-1]['path'] if result.checkpoints else 'none'})")
    return 0
