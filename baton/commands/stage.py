"""`baton stage cpt|sft [overrides]`: run one stage's DeepSpeed workers."""
from __future__ import annotations

import contextlib

from baton.errors import ConfigError


def add_arguments(parser) -> None:
    parser.add_argument("name", choices=["cpt", "sft", "rm", "rl"], help="stage to run")


def prepare(overrides: list[str], name: str, locks: contextlib.ExitStack | None = None):
    """Compose + validate the config and check a resume target before any worker starts.
    With `locks`, the stage directory's lock is taken into it before anything is written:
    a directory another run holds is refused at once."""
    from baton.config import compose
    from ckpt.layout import resolve_resume
    from ckpt.compat import check_resumable
    from ckpt.layout import checkpoints_dir
    from stages.model import ensure_model_dir, model_identity_from_dir
    from stages.preflight import check_stage_inputs

    if any(o.startswith("stage.name=") for o in overrides):
        raise ConfigError(["stage.name is set by the command: use `baton stage NAME`"])
    cfg = compose([f"stage={name}", *overrides])
    from ckpt import signing
    signing.configure(cfg.ckpt.signing_key_env)  # checkpoints read below must be signed too
    check_stage_inputs(cfg)  # a bad model.path or init_from is refused before any worker
    if locks is not None:  # before the first write (the built-in model, launch.json)
        from ckpt.layout import stage_dir
        from stages.run_lock import stage_lock
        locks.enter_context(stage_lock(stage_dir(cfg.run.dir, name)))
    model_dir = ensure_model_dir(cfg)
    s = cfg.stage
    if s.init_from and (s.init_optimizer or s.init_scheduler or s.init_rng):
        from ckpt.carry import check_carry_layout
        check_carry_layout(s.init_from, cfg.parallel.world_size, cfg.parallel.zero_stage)
    target = resolve_resume(cfg.resume, checkpoints_dir(cfg.run.dir, name))
    if target is not None:
        parallel = {"world_size": cfg.parallel.world_size, "zero_stage": cfg.parallel.zero_stage}
        check_resumable(target, name, parallel, model_identity_from_dir(model_dir, name))
    return cfg, model_dir


def main(args) -> int:
    from stages.launch import launch_stage

    with contextlib.ExitStack() as locks:  # held until the workers are gone
        cfg, model_dir = prepare(args.overrides, args.name, locks)
        parent = {"init_from": cfg.stage.init_from} if cfg.stage.init_from else None
        result = launch_stage(cfg, model_dir, parent, inputs_checked=True)
    print(f"[baton] stage {args.name} {result.status} at step {result.step}; "
          f"checkpoints in {result.checkpoints_dir} (latest -> {result.checkpoints[-1]['path'] if result.checkpoints else 'none'})")
    return 0
