"""Checkpoints taken mid-accumulation: what is recorded and how the buffers come back.

DeepSpeed keeps accumulated gradients in different places per ZeRO stage (param.grad
without ZeRO, reduce-scattered partitions in ZeRO-2/3), none of them a public API. So
the checkpoint records the accumulation window itself — the RNG state at its start
and the micro-batches already consumed — and resume rebuilds the buffers by replaying
those micro-batches on the restored weights, which is deterministic on CPU. Where the
buffers are plain `param.grad` (ZeRO 0) they are also saved, and the replayed
gradients must equal them bit for bit or the resume stops.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from ckpt.errors import CorruptCheckpoint
from ckpt.state import RngState


class Window:
    """The accumulation window in progress: its start RNG, losses and tokens so far."""

    def start(self, rng_state: dict) -> None:
        self.rng_state, self.losses, self.tokens = rng_state, [], 0

    def add(self, loss: float, tokens: int) -> None:
        self.losses.append(loss)
        self.tokens += tokens

    def reduce(self, world: int) -> tuple[float, int]:
        """(sum over ranks of the mean-per-rank loss sum / world, total tokens)."""
        totals = torch.tensor([sum(self.losses), float(self.tokens)], dtype=torch.float64)
        dist.all_reduce(totals)
        return float(totals[0]) / world, int(totals[1])

    def record(self, progress) -> dict:
        return {"step": progress.step, "micro_in_window": progress.micro_in_window,
                "window_start_rng": self.rng_state,
                "replay": "forward/backward of micro-steps 0..micro_in_window-1 of this step"}


def readable_buffers(engine, zero_stage: int) -> bytes | None:
    if zero_stage != 0:
        return None
    from safetensors.torch import save

    grads = {name: p.grad.detach().clone() for name, p in engine.module.named_parameters()
             if p.grad is not None}
    return save(grads)


def replay(worker, state: dict) -> None:
    """Rebuild the accumulation buffers of a mid-window checkpoint."""
    record = state["grad_record"]
    RngState.load_state_dict(record["window_start_rng"])
    worker.window.start(record["window_start_rng"])
    done = record["micro_in_window"]
    worker.engine.micro_steps = worker.progress.micro_step - done
    for micro in range(done):
        worker.micro_step(micro)
    if state["grad_buffers"] is not None:
        _check_against_saved(worker, state)
    worker.files.log(f"rebuilt gradient accumulation buffers by replaying {done} micro-step(s)")


def _check_against_saved(worker, state: dict) -> None:
    from safetensors.torch import load

    saved = load(state["grad_buffers"])
    for name, p in worker.engine.module.named_parameters():
        if name in saved and (p.grad is None or not torch.equal(p.grad, saved[name])):
            raise CorruptCheckpoint(state["manifest"].stage, [
                f"replayed gradient of {name} differs from the saved accumulation buffer"])
