"""Build the DeepSpeed engine for a stage: config dict, LR schedule, distributed init."""
from __future__ import annotations

import os

import torch

from ckpt.parallel_layout import accumulation_steps
from core.repro import use_deterministic_algorithms


BUCKET_ELEMENTS = 20_000_000


def backend_for(requested: str) -> str:
    if requested != "auto":
        return requested
    return "nccl" if torch.cuda.is_available() else "gloo"


def deepspeed_config(stage_cfg, parallel_cfg) -> dict:
    accumulation = accumulation_steps(stage_cfg.global_batch, stage_cfg.micro_batch,
                                      parallel_cfg.world_size)
    return {
        "train_batch_size": stage_cfg.global_batch,
        "train_micro_batch_size_per_gpu": stage_cfg.micro_batch,
        "gradient_accumulation_steps": accumulation,
        "gradient_clipping": stage_cfg.grad_clip,
        "optimizer": {"type": "AdamW", "params": {
            "lr": stage_cfg.lr, "betas": [0.9, 0.95], "eps": 1e-8,
            "weight_decay": stage_cfg.weight_decay,
            # torch's AdamW: no FusedAdam build needed on CPU-only machines
            "torch_adam": True}},
        # DeepSpeed's default 5e8-element buckets are allocated every micro-step; under
        # torch.use_deterministic_algorithms each allocation is NaN-filled (2 GB per
        # step), which dominates a small model's step time.
        "zero_optimization": {"stage": parallel_cfg.zero_stage, "overlap_comm": False,
                              "reduce_bucket_size": BUCKET_ELEMENTS,
                              "allgather_bucket_size": BUCKET_ELEMENTS,
                              "stage3_prefetch_bucket_size": BUCKET_ELEMENTS,
                              "stage3_param_persistence_threshold": 0},
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
        # baton names checkpoints from the step, the same on every rank; DeepSpeed's check
        # of that is one all_reduce per save on the training thread.
        "checkpoint": {"load_universal": False, "tag_validation": "Ignore"},
    }


def warmup_decay(stage_cfg):
    """Linear warmup to lr, then linear decay to min_lr_ratio * lr at max_steps."""
    warmup, total, floor = stage_cfg.warmup_steps, stage_cfg.max_steps, stage_cfg.min_lr_ratio

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return floor + (1.0 - floor) * (1.0 - progress)

    return factor


def build_engine(model, stage_cfg, parallel_cfg):
    import deepspeed

    def scheduler(optimizer):
        return torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_decay(stage_cfg))

    engine, _, _, _ = deepspeed.initialize(
        model=model, model_parameters=[p for p in model.parameters() if p.requires_grad],
        config=deepspeed_config(stage_cfg, parallel_cfg), lr_scheduler=scheduler)
    return engine


def init_distributed(parallel_cfg) -> tuple[int, int]:
    import deepspeed

    # One intra-op thread per rank: 2 cores shared by up to 2 ranks, and reductions
    # whose order does not depend on how many threads happened to be free.
    torch.set_num_threads(1)
    use_deterministic_algorithms()
    ranks_follow_nodes(parallel_cfg)
    deepspeed.init_distributed(dist_backend=backend_for(parallel_cfg.backend))
    return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])


def ranks_follow_nodes(parallel_cfg) -> None:
    """Node K's ranks are K * ranks-per-node + local rank, run after run.

    torchrun's c10d rendezvous numbers the nodes in the order of their agents' (address,
    pid), so after a restart node 1 may come back holding ranks 0..n-1. A rank's data
    shard, RNG stream and the files of a node's memory-tier copy (ckpt.node_copies)
    follow its number, so baton numbers ranks by `parallel.node_rank` instead. Safe only
    when every worker connects to the agent's store as a client (torchrun's default,
    TORCHELASTIC_USE_AGENT_STORE=True): no worker hosts the store, so any numbering that
    is a permutation works. Otherwise torchrun's numbers stay, and a node copy that does
    not hold a rank's files is not used (stages.tier_restore.agree_across_nodes)."""
    if parallel_cfg.nodes <= 1 or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return
    per_node = int(os.environ["LOCAL_WORLD_SIZE"])
    os.environ["RANK"] = str(int(parallel_cfg.node_rank) * per_node + int(os.environ["LOCAL_RANK"]))
