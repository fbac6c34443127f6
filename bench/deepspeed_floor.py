"""The DeepSpeed floor: the commit floor plus what any save through DeepSpeed costs the
training thread before a checkpointer captures anything.

Every baton save calls DeepSpeed's `save_checkpoint`, which builds the module's and the
optimizer's state dicts, the scheduler's and the engine's counters, the tag and the paths,
and hands each file's state to the checkpoint engine; and the caller builds the save's
payload (progress, RNG states). This floor does both every step, through a checkpoint
engine that keeps nothing (`DiscardingEngine`), DeepSpeed's barriers skipped at world
size 1 as in a baton save (ckpt.lone_rank), then saves as the commit floor does
(bench.commit_floor: the state's bytes copied off the training thread, baton's files
committed by another process, nothing computed).

The training thread's time in the two (`call_s`) is measured save by save: it is on the
step's critical path whatever runs beside it, so its share of a step is a floor that does
not wait on the throughput rounds' noise.

So it bounds from above every checkpointer that saves through DeepSpeed's
`save_checkpoint` and keeps baton's contract: what it costs, any such checkpointer costs
at least, whatever it does with the state DeepSpeed hands it. Where its whole interval is
below 0.97, none can cost 3% or less every step on this machine; reaching the bar would
then need a save that does not go through `save_checkpoint`.
"""
from __future__ import annotations

import time
from pathlib import Path

import torch.distributed as dist
from deepspeed.runtime.checkpoint_engine.checkpoint_engine import CheckpointEngine

from bench.methods.baton_checkpointer import payload
from ckpt.lone_rank import barriers_skipped


class DiscardingEngine(CheckpointEngine):
    """A DeepSpeed checkpoint engine that drops every file it is handed."""

    def __init__(self):
        super().__init__(None)
        self.files = 0
        """Files DeepSpeed handed over: a floor that saved nothing would measure nothing."""

    def create(self, info):
        pass

    def save(self, state_dict, path: str):
        self.files += 1

    def commit(self, info):
        return True

    def load(self, path: str, map_location=None):
        raise NotImplementedError("the DeepSpeed floor saves nothing to load")


class DeepSpeedFloorEveryStep:
    """After each step: DeepSpeed's `save_checkpoint` into a `DiscardingEngine`, the
    payload built, then `commit_floor.save()`. `drain` as the commit floor's; the commit
    floor is closed by its owner (and removes this floor's directory, inside its own)."""

    def __init__(self, engine, commit_floor, tokens_per_step: int):
        self.engine, self.commit_floor, self.tokens_per_step = engine, commit_floor, tokens_per_step
        self.directory = str(Path(commit_floor.home) / "deepspeed-floor")
        self.world = dist.get_world_size()  # read once, as the Checkpointer does: not timed
        self.discarding = DiscardingEngine()
        self.saves = 0
        self.call_s: list[float] = []
        """Per save: the training thread's seconds in save_checkpoint and the payload."""

    def save(self) -> None:
        started = time.perf_counter()
        previous, self.engine.checkpoint_engine = self.engine.checkpoint_engine, self.discarding
        try:
            with barriers_skipped(self.world):
                self.engine.save_checkpoint(self.directory, tag=f"step{self.saves}",
                                            save_latest=False)
        finally:
            self.engine.checkpoint_engine = previous
        self.saves += 1
        payload(self.saves, self.tokens_per_step)
        self.call_s.append(time.perf_counter() - started)
        self.commit_floor.save()

    def drain(self) -> None:
        self.commit_floor.drain()
