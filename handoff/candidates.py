"""Diagnostics of every candidate checkpoint at a handoff (single process, CPU is enough).

Language-model checkpoints (CPT, SFT) get `handoff.diagnostics.lm_diagnostics`; reward
models get pairwise accuracy, held-out Bradley-Terry loss and the mean entropy of
their preference probability.
"""
from __future__ import annotations

import logging

import torch

from handoff.selection import Candidate
from ckpt.weights import load_weights_into
from handoff.diagnostics import lm_diagnostics
from stages.model import load_model_and_tokenizer
from stages.tasks import ArithmeticTasks

log = logging.getLogger(__name__)


def evaluate_candidates(checkpoints: list[tuple[str, int]], from_stage: str, model_dir: str,
                        target_cfg, selection, source_cfg=None) -> list[Candidate]:
    """`checkpoints`: (path, step) pairs. `target_cfg` supplies rollout temperature etc.
    On your own data (stages.data) a policy is judged on the next stage's held-out rows,
    a reward model on its own (`source_cfg`: the stage that trained the candidates)."""
    torch.set_num_threads(1)
    tasks = ArithmeticTasks(target_cfg.seed, target_cfg.data.max_operand,
                            target_cfg.data.heldout_fraction)
    evaluate = _rm_metrics if from_stage == "rm" else _lm_metrics
    data = _own_data(source_cfg if from_stage == "rm" else target_cfg, model_dir)
    candidates = []
    for path, step in checkpoints:
        metrics = evaluate(path, model_dir, tasks, target_cfg, selection, data)
        print(f"[handoff] candidate {from_stage} step {step}: "
              + " ".join(f"{k}={v:.4f}" for k, v in metrics.items()), flush=True)
        candidates.append(Candidate(path=path, step=step, metrics=metrics))
    return candidates


def _own_data(cfg, model_dir: str):
    """The stage's data (its cached tokenized copy) when it trains on your own data."""
    from stages.data.prepare import prepare_data, uses_own_data

    if cfg is None or not uses_own_data(cfg, cfg.stage.name):
        return None
    from pathlib import Path

    from stages.data.examples import FileExamples
    return FileExamples(prepare_data(cfg, Path(model_dir)))


def _lm_metrics(path, model_dir, tasks, target_cfg, selection, data=None) -> dict:
    model, tokenizer = load_model_and_tokenizer(model_dir)
    load_weights_into(model, path)
    if data is not None:
        from handoff.data_diagnostics import data_diagnostics
        from stages.data.rewards import scorer_for
        from stages.sampling import stop_token_ids
        scorer = (scorer_for(target_cfg, data.plan)
                  if target_cfg.stage.name == "rl" and target_cfg.rl.reward.functions else None)
        return data_diagnostics(model, tokenizer, data, probe_prompts=selection.probe_prompts,
                                samples_per_prompt=selection.samples_per_prompt, k=selection.k,
                                temperature=target_cfg.stage.temperature,
                                max_new_tokens=target_cfg.stage.max_new_tokens, seed=target_cfg.seed,
                                stop_ids=stop_token_ids(tokenizer, model_dir), scorer=scorer, pass_threshold=target_cfg.rl.reward.pass_threshold)
    return lm_diagnostics(model, tokenizer, tasks, probe_prompts=selection.probe_prompts,
                          samples_per_prompt=selection.samples_per_prompt, k=selection.k,
                          temperature=target_cfg.stage.temperature,
                          max_new_tokens=target_cfg.stage.max_new_tokens, seed=target_cfg.seed)


def _rm_metrics(path, model_dir, tasks, target_cfg, selection, data=None) -> dict:
    """Pairwise accuracy, Bradley-Terry loss and preference entropy on held-out pairs."""
    from dataclasses import replace

    from stages.rm import RmObjective

    model, tokenizer = RmObjective.build_model(model_dir)
    load_weights_into(model, path)
    stage_cfg = replace(target_cfg.stage, eval_samples=selection.probe_prompts * 4, micro_batch=16,
                        seq_len=32)
    metrics = RmObjective(stage_cfg, tokenizer, tasks, data).evaluate(model.eval())
    return {"eval_accuracy": metrics["eval_accuracy"], "heldout_loss": metrics["eval_loss"],
            "entropy": metrics["eval_pref_entropy"]}


def new_parameters(to_stage: str, model_dir: str, checkpoint: str) -> list[str]:
    """Parameters the downstream stage's model has and the chosen checkpoint lacks (the
    RM's scalar head): they start freshly initialised, and the handoff records them."""
    from ckpt.weights import consolidated_state_dict
    from stages.registry import objective_class

    model, _ = objective_class(to_stage).build_model(model_dir)
    saved = consolidated_state_dict(checkpoint)
    return sorted(name for name, _ in model.named_parameters() if name not in saved)
