"""The parallel layout a checkpoint was saved under, as one typed value.

Built once from the config (`from_config`), written into the manifest (`to_dict`, the
same keys manifests have always carried, so older checkpoints read back unchanged) and
compared with `==`. Only world size and ZeRO stage decide how DeepSpeed shards its
files; that part is `Layout.sharding`, which resume, carry and reshard compare.
"""
from __future__ import annotations

from dataclasses import dataclass


def accumulation_steps(global_batch: int, micro_batch: int, world_size: int) -> int:
    """Micro-batches each rank runs per optimizer step (the one place this is computed)."""
    return global_batch // (micro_batch * world_size)


@dataclass(frozen=True)
class Sharding:
    """What a checkpoint's per-rank files depend on: the part a reshard changes."""

    world_size: int
    zero_stage: int

    def to_dict(self) -> dict:
        return {"world_size": self.world_size, "zero_stage": self.zero_stage}

    @classmethod
    def from_dict(cls, data: dict) -> "Sharding":
        return cls(int(data.get("world_size", 1)), int(data.get("zero_stage", 0)))

    def __str__(self) -> str:
        return f"world_size={self.world_size} zero_stage={self.zero_stage}"


@dataclass(frozen=True)
class Layout:
    world_size: int
    zero_stage: int
    micro_batch: int
    global_batch: int

    @property
    def accumulation(self) -> int:
        """Micro-batches each rank runs per optimizer step."""
        return accumulation_steps(self.global_batch, self.micro_batch, self.world_size)

    @property
    def sharding(self) -> Sharding:
        return Sharding(self.world_size, self.zero_stage)

    @classmethod
    def from_config(cls, cfg, world_size: int | None = None) -> "Layout":
        """From a composed config; `world_size`: the live one when it is known (workers)."""
        return cls(int(world_size if world_size is not None else cfg.parallel.world_size),
                   int(cfg.parallel.zero_stage), int(cfg.stage.micro_batch),
                   int(cfg.stage.global_batch))

    def to_dict(self) -> dict:
        """The manifest's `parallel` keys (gradient_accumulation_steps kept for readers)."""
        return {"world_size": self.world_size, "zero_stage": self.zero_stage,
                "micro_batch": self.micro_batch, "gradient_accumulation_steps": self.accumulation,
                "global_batch": self.global_batch}

    @classmethod
    def from_dict(cls, data: dict) -> "Layout":
        """Accepts every manifest's `parallel` dict; extra keys (backend) are ignored."""
        return cls(int(data.get("world_size", 1)), int(data.get("zero_stage", 0)),
                   int(data.get("micro_batch", 0)), int(data.get("global_batch", 0)))
