"""Carry optimizer moments, scheduler position and RNG from the previous stage's checkpoint.

Weights always come through `ckpt.weights` (any layout). The rest lives in
DeepSpeed's per-layout files, so it can only be carried from a checkpoint saved at
this run's world size and ZeRO stage — which is what the handoff's reshard produces.
"""
from __future__ import annotations

from pathlib import Path

from ckpt import manifest as manifest_io
from ckpt.state_files import rng_file
from ckpt.errors import IncompatibleCheckpoint
from ckpt.parallel_layout import Sharding


def check_carry_layout(directory: str | Path, world_size: int, zero_stage: int):
    """Verify the checkpoint and refuse a layout other than this run's; return its manifest."""
    directory = Path(directory)
    manifest = manifest_io.verify(directory)
    if manifest.adopted is not None:
        from ckpt.adopt import state_refusal
        raise state_refusal(directory, manifest, "carried into this stage")
    here, saved = Sharding(world_size, zero_stage), manifest.layout.sharding
    if saved != here:
        raise IncompatibleCheckpoint(directory, (
            f"cannot carry optimizer/scheduler/RNG from layout {saved.to_dict()} into "
            f"{here.to_dict()}; reshard it "
            f"first: baton ckpt reshard {directory} DST parallel.world_size={world_size} "
            f"parallel.zero_stage={zero_stage}"))
    return manifest


def carry_from(checkpointer, directory: str | Path, *, optimizer: bool, scheduler: bool,
               rng: bool) -> list[str]:
    """Load the requested parts into the live engine (all ranks); return what was carried."""
    checkpointer.before_update()  # a load writes in place: a lazy save's copies land first
    directory = Path(directory)
    manifest = check_carry_layout(directory, checkpointer.world, checkpointer.layout.zero_stage)
    carried = []
    io = checkpointer.io
    io.begin_load(directory, manifest)
    if optimizer or scheduler:
        # Weights are loaded again here; they are the same ones init_from already put in.
        checkpointer.engine.load_checkpoint(
            str(directory.parent), tag=directory.name, load_optimizer_states=optimizer,
            load_lr_scheduler_states=scheduler, load_module_only=not (optimizer or scheduler))
        carried += ["optimizer moments"] * optimizer + ["LR scheduler position"] * scheduler
    if rng:
        from ckpt.state import RngState
        RngState.load_state_dict(io.load_json(directory / rng_file(checkpointer.rank)))
        carried.append("RNG streams")
    return carried
