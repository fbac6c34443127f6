"""Checks a stage passes before any of its workers start (`baton stage NAME`).

Every refusal here (bad inputs, a held stage directory, a checkpoint that cannot be
resumed) costs seconds; the same refusal inside eight DeepSpeed workers costs minutes
and leaves half-written state behind.
"""
from __future__ import annotations

import contextlib


def prepare_stage(cfg, name: str, locks: contextlib.ExitStack | None = None):
    """Check the composed config's inputs and resume target; return the model directory.
    With `locks`, the stage directory's lock is taken into it before anything is written:
    a directory another run holds is refused at once."""
    from ckpt import signing
    from ckpt.compat import check_resumable
    from ckpt.layout import checkpoints_dir, resolve_resume, stage_dir
    from ckpt.parallel_layout import Layout
    from stages.model import ensure_model_dir, model_files_digest, model_identity_from_dir
    from stages.model import model_dir as model_dir_of
    from stages.preflight import check_stage_inputs
    from stages.run_lock import stage_lock

    signing.configure(cfg.ckpt.signing_key_env)  # checkpoints read below must be signed too
    check_stage_inputs(cfg)  # a bad model.path or init_from is refused before any worker
    if locks is not None:  # before the first write (the built-in model, launch.json)
        locks.enter_context(stage_lock(stage_dir(cfg.run.dir, name), node=cfg.parallel.node_rank))
    if cfg.resume == "latest":
        from ckpt.tiers.plan import TierPlan
        if TierPlan.from_config(cfg).enabled:  # the newest verified copy in any tier
            from stages.tier_restore import restore_latest
            cfg.resume = restore_latest(cfg) or "latest"
    s = cfg.stage
    if s.init_from and (s.init_optimizer or s.init_scheduler or s.init_rng):
        from ckpt.carry import check_carry_layout
        check_carry_layout(s.init_from, cfg.parallel.world_size, cfg.parallel.zero_stage)
    if s.init_from and cfg.parallel.node_rank == 0:
        from ckpt.layout import step_of
        from ckpt.retention import pin
        if step_of(s.init_from) is not None:  # lineage names it: its stage must not delete it
            try:
                pin(s.init_from, f"stage {name} in {cfg.run.dir} started from it")
            except OSError:  # a read-only place: no retention can delete anything there either
                pass
    target = resolve_resume(cfg.resume, checkpoints_dir(cfg.run.dir, name))
    if target is None and name != "rl":
        # Nothing here reads the model: the workers create the built-in one if it is not
        # there yet (stages.worker), after the imports they pay anyway. RL's roles load it
        # beside the workers, so RL has it made here.
        return model_dir_of(cfg)
    model_dir = ensure_model_dir(cfg)
    if target is not None:
        def identity() -> dict:  # imports torch and transformers: only when it must
            from stages.registry import objective_class
            return model_identity_from_dir(model_dir, objective_class(name).model_class)

        parallel = Layout.from_config(cfg).sharding.to_dict()
        check_resumable(target, name, parallel, identity, model_files=model_files_digest(model_dir))
    return model_dir

