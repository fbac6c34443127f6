"""Load a universal checkpoint under the target layout and save it as a baton checkpoint.

One process per target rank: `python -m stages.launch_agent --standalone --nproc-per-node=N
-m stages.lean_start stages.reshard_worker LAUNCH.json` (torchrun tied to its launcher,
handoff.reshard).
Builds the stage's model and engine exactly as `stages.worker` does, with DeepSpeed's
`load_universal` on, loads, runs the probe batch, and saves through `Checkpointer` into
a staging root; handoff.reshard decides whether it becomes DST.
"""
from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from core.config.compose import from_dict
from ckpt import safe_load, signing, universal
from ckpt.checkpointer import Checkpointer, SaveOptions, SavePayload
from ckpt.parallel_layout import Layout
from ckpt.state import RngState, derived_seed, seed_everything
from stages.engine_setup import deepspeed_config, init_distributed, warmup_decay
from stages.lifeline import worker_start
from stages.model import load_model_and_tokenizer, model_identity
from stages.registry import objective_class
from stages.run_files import RunFiles
from stages.tasks import HELDOUT, ArithmeticTasks


def build_engine(model, stage_cfg, parallel_cfg):
    """stages.engine_setup.build_engine with universal loading on. ZeRO 0 keeps it off:
    DeepSpeed's universal path restores parameters only through a ZeRO optimizer, so
    `load_zero0` below puts them in place instead."""
    import deepspeed

    config = deepspeed_config(stage_cfg, parallel_cfg)
    config["checkpoint"] = {"load_universal": parallel_cfg.zero_stage > 0}

    def scheduler(optimizer):
        return torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_decay(stage_cfg))

    engine, _, _, _ = deepspeed.initialize(
        model=model, model_parameters=[p for p in model.parameters() if p.requires_grad],
        config=config, lr_scheduler=scheduler)
    return engine


def load_zero0(engine, folder: Path) -> None:
    """Parameters, Adam moments, scheduler and counters from a universal folder, no ZeRO."""
    states = universal.read_states(folder)
    step = torch.tensor(universal.universal_step(folder))
    base = getattr(engine.optimizer, "optimizer", engine.optimizer)
    with torch.no_grad():
        for name, param in engine.module.named_parameters():
            param.copy_(states[name]["fp32"].view_as(param))
            base.state[param] = {"step": step.clone(), **{k: states[name][k].view_as(param).clone()
                                                          for k in universal.MOMENTS}}
    optim_sd = universal.load_file(folder / "zero" / "optimizer_state.pt")
    for group, saved in zip(base.param_groups, optim_sd["param_groups"]):
        group.update({k: v for k, v in saved.items() if k != "params"})
    model_states = universal.load_file(folder / universal.MODEL_STATES)
    engine.lr_scheduler.load_state_dict(model_states["lr_scheduler"])
    engine.global_steps = model_states["global_steps"]
    engine.global_samples = model_states.get("global_samples", 0)
    engine.skipped_steps = model_states.get("skipped_steps", 0)


def load(engine, launch: dict, rank: int, zero_stage: int) -> None:
    folder = Path(launch["universal"])
    if rank == 0:
        universal.check_fingerprint(folder, launch["fingerprint"])
    dist.barrier()
    if zero_stage == 0:
        load_zero0(engine, folder)
    else:
        engine.load_checkpoint(str(folder.parent), tag=folder.name, load_optimizer_states=True,
                               load_lr_scheduler_states=True)


@torch.no_grad()
def probe(model, objective, indices: list[int]) -> tuple[float, torch.Tensor]:
    """Loss and logits of the fixed probe batch (held-out split, so no training sample)."""
    batch = objective.batch(HELDOUT, indices)
    out = model(**batch)
    return float(out.loss), out.logits.detach().float().cpu()


def source_probe(launch: dict, objective, indices: list[int]) -> tuple[float, torch.Tensor]:
    """The same probe on SRC's consolidated weights, independent of the converter."""
    from ckpt.weights import load_weights_into

    model, _ = load_model_and_tokenizer(launch["model_dir"])
    load_weights_into(model, launch["source"])
    return probe(model, objective, indices)


def write_probe(launch: dict, objective, target: tuple[float, torch.Tensor]) -> None:
    loss_src, logits_src = source_probe(launch, objective, launch["probe_indices"])
    loss_tgt, logits_tgt = target
    Path(launch["probe_out"]).write_text(json.dumps({
        "probe_loss_source": loss_src, "probe_loss_target": loss_tgt,
        "max_abs_logit_diff": float((logits_src - logits_tgt).abs().max())}))


def save(engine, launch: dict, cfg, identity: dict, rank: int, world: int) -> Path:
    s = cfg.stage
    parallel = {**Layout.from_config(cfg, world).to_dict(), "backend": dist.get_backend()}
    files = RunFiles(Path(launch["staging"]), writer=False)
    # Per-rank RNG cannot be carried across world sizes; derive it as a fresh run would.
    seed_everything(derived_seed(cfg.seed, s.name, rank))
    payload = SavePayload(progress=launch["progress"], data=launch["data"],
                          meta=files.meta(launch, identity, parallel), rng=RngState.state_dict(),
                          extra={"reshard": launch["transform"]})
    # One save, then the process ends: nothing to overlap with, so it runs synchronously.
    checkpointer = Checkpointer(engine, Path(launch["staging"]), s.name, parallel, keep_last=1,
                                options=SaveOptions(mode="sync"))
    return checkpointer.save(launch["progress"]["step"], payload)


def main(launch_path: str) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    launch = worker_start(launch_path)  # dies with its launcher; refuses another's launch file
    safe_load.install()  # DeepSpeed's universal loader calls torch.load(weights_only=False)
    cfg = from_dict(launch["config"])
    signing.configure(cfg.ckpt.signing_key_env)  # the staged checkpoint is signed like SRC's run
    rank, world = init_distributed(cfg.parallel)
    seed_everything(derived_seed(cfg.seed, cfg.stage.name, rank))
    model, tokenizer = load_model_and_tokenizer(launch["model_dir"])
    identity = model_identity(model, tokenizer)
    tasks = ArithmeticTasks(cfg.seed, cfg.data.max_operand, cfg.data.heldout_fraction)
    objective = objective_class(cfg.stage.name)(cfg.stage, tokenizer, tasks)
    engine = build_engine(model, cfg.stage, cfg.parallel)
    load(engine, launch, rank, cfg.parallel.zero_stage)
    target = probe(engine.module, objective, launch["probe_indices"])  # collective under ZeRO-3
    if rank == 0:
        write_probe(launch, objective, target)
    save(engine, launch, cfg, identity, rank, world)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
