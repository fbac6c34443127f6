"""The state every method saves: a Llama (stages.model's builder) in a DeepSpeed engine
(ZeRO-0, world size 1, gloo, torch AdamW) after one optimizer step, so both Adam moments
exist. Sized so fp32 weights + both moments (12 bytes per parameter) reach the asked GB.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

BYTES_PER_PARAM = 12  # fp32 weight + exp_avg + exp_avg_sq
GB = 1e9
WIDTH_STEP = 64  # with head_dim 32 or 64 (see `shape_for`) heads stay even


def llama_params(hidden: int, layers: int, vocab: int) -> int:
    """Parameters of the built-in Llama shape: MLP width 2*hidden, half as many KV heads
    as heads (so k and v are hidden x hidden/2), untied embeddings, RMSNorm weights."""
    attention = 2 * hidden * hidden + 2 * hidden * (hidden // 2)  # q, o; k, v
    per_layer = attention + 3 * hidden * (2 * hidden) + 2 * hidden  # + MLP, 2 norms
    return layers * per_layer + 2 * vocab * hidden + hidden


def shape_for(size_gb: float, vocab: int) -> dict:
    """Model overrides whose state is closest to `size_gb`."""
    target = size_gb * GB / BYTES_PER_PARAM
    layers = 1 if target < 200_000 else 2 if target < 20_000_000 else 4
    widths = range(WIDTH_STEP, 64 * 1024, WIDTH_STEP)
    hidden = min(widths, key=lambda h: abs(llama_params(h, layers, vocab) - target))
    # Even head counts, so half as many KV heads divide them (grouped-query attention).
    head_dim = 64 if hidden >= 512 and (hidden // 64) % 2 == 0 else 32
    heads = hidden // head_dim
    return {"hidden_size": hidden, "intermediate_size": 2 * hidden, "num_hidden_layers": layers,
            "num_attention_heads": heads, "num_key_value_heads": heads // 2}


@dataclass
class BenchState:
    label: str
    cfg: object
    engine: object
    layout: dict
    """The manifest's `parallel` (ckpt.parallel_layout.Layout.to_dict() + backend)."""

    @property
    def module(self):
        return self.engine.module

    def state_dict(self) -> dict:
        """What torch.save and DCP are given: the same tensors DeepSpeed's engine saves."""
        return {"model": self.engine.module.state_dict(),
                "optimizer": self.engine.optimizer.state_dict()}

    def tensors(self) -> list[torch.Tensor]:
        found: list[torch.Tensor] = []

        def walk(value) -> None:
            if isinstance(value, torch.Tensor):
                found.append(value)
            elif isinstance(value, dict):
                for item in value.values():
                    walk(item)
            elif isinstance(value, (list, tuple)):
                for item in value:
                    walk(item)

        walk(self.state_dict())
        return found

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors())

    def params(self) -> int:
        return sum(p.numel() for p in self.engine.module.parameters())

    def close(self) -> None:
        self.engine.destroy()
        self.engine = None


def build_state(label: str, overrides: list[str], run_dir: Path, model: dict | None) -> BenchState:
    """Compose the config (`model`: overrides of the built-in model's shape, None for the
    configured model), build the model as a stage does, wrap it, take one optimizer step."""
    from core.config import compose
    from ckpt.parallel_layout import Layout
    from stages.engine_setup import build_engine
    from stages.model import ensure_model_dir, load_model_and_tokenizer

    from bench.distributed import init_single_rank
    from bench.training import train_steps

    shape = [] if model is None else [
        "model.path=null", *(f"model.{key}={value}" for key, value in model.items())]
    cfg = compose([*overrides, *shape, f"run.dir={run_dir}", "parallel.world_size=1",
                   "parallel.zero_stage=0", "parallel.backend=gloo"])
    if model is not None:
        # One micro-batch per optimizer step: the large model's step stays seconds long.
        cfg.stage.global_batch = cfg.stage.micro_batch
    init_single_rank(cfg.parallel)
    module, _ = load_model_and_tokenizer(ensure_model_dir(cfg))
    engine = build_engine(module, cfg.stage, cfg.parallel)
    train_steps(engine, cfg.stage, steps=1)
    layout = {**Layout.from_config(cfg, 1).to_dict(), "backend": "gloo"}
    return BenchState(label, cfg, engine, layout)
