"""The objective base every stage builds on: how a micro-batch is built and what its loss is.

Kept flat on purpose (torchtune recipes): each objective (stages.cpt, .sft, .rm, .rl,
named in stages.registry) is a small class with
`batch(split, indices)`, `loss(model, batch)` and `evaluate(model)`. The worker also
calls four hooks whose defaults here suit a plain causal LM: `build_model(model_dir)`
(which model class a stage trains), `setup(model_dir)` (frozen helper models),
`step_metrics()` (extra per-step metrics, a collective) and `state_dict()` /
`load_state_dict()` (objective state saved in checkpoints; None when there is none).
"""
from __future__ import annotations

import numpy as np
import torch

from stages.data.examples import BuiltinExamples
from stages.data.render import IGNORE
from stages.model import load_model_and_tokenizer
from stages.tasks import HELDOUT, ArithmeticTasks


def pad(rows: list[list[int]], value: int) -> torch.Tensor:
    """Rows right-padded with `value` to the longest, as one int64 tensor (filled through
    numpy: one allocation, no nested Python lists for torch to walk)."""
    width = max(len(r) for r in rows)
    out = np.full((len(rows), width), value, dtype=np.int64)
    for i, row in enumerate(rows):
        out[i, :len(row)] = row
    return torch.from_numpy(out)


def pad_id(tokenizer) -> int:
    """The id padding is written with. Padding is masked out of attention and loss, so a
    tokenizer without a pad token (Llama's) pads with EOS."""
    for candidate in (tokenizer.pad_token_id, tokenizer.eos_token_id):
        if candidate is not None:
            return candidate
    return 0


class CausalLMObjective:
    name = "lm"
    new_head = False
    """May stage.init_from lack this model's head (then freshly initialised)?"""

    def __init__(self, stage_cfg, tokenizer, tasks: ArithmeticTasks, data=None):
        """`data`: the examples trained on (stages.data.examples); None: the built-in tasks."""
        self.cfg, self.tokenizer, self.tasks = stage_cfg, tokenizer, tasks
        self.data = data or BuiltinExamples(tasks, tokenizer, stage_cfg.name, stage_cfg.seq_len)

    @staticmethod
    def model_class(config):
        """The Hugging Face class this objective trains, for a model config."""
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING
        return MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]

    @classmethod
    def build_model(cls, model_dir):
        """(model, tokenizer) from a model directory, as `model_class` says."""
        return load_model_and_tokenizer(model_dir, cls.model_class)

    def setup(self, model_dir) -> None:
        """Load frozen helper models (RL: reference, reward model); nothing for LM stages."""

    def bind(self, cfg, sampler, run_dir) -> None:
        """Told the run's config, sampler and directory once they exist (RL: its journal
        and roles); nothing for LM stages."""

    def at_step(self, step: int) -> None:
        """Told the optimizer step before each micro-step (RL seeds its rollouts with it)."""

    def step_metrics(self) -> dict:
        """Extra metrics of the step just finished (all ranks call it: may all-reduce)."""
        return {}

    def state_dict(self) -> dict | None:
        return None

    def load_state_dict(self, state: dict) -> None:
        """LM objectives keep no state of their own."""

    def dataset_size(self, split: str) -> int:
        return self.data.size(split)

    def eval_count(self) -> int:
        """Held-out examples per evaluation: stage.eval_samples, or all there are."""
        return min(self.cfg.eval_samples, self.dataset_size(HELDOUT))

    def examples(self, split: str, indices: list[int]) -> list[tuple[list[int], list[int]]]:
        """(input ids, labels) per example; labels use IGNORE where no loss is taken."""
        return self.data.lm_examples(split, indices)

    def batch(self, split: str, indices: list[int]) -> dict:
        rows = self.examples(split, indices)
        input_ids = pad([ids for ids, _ in rows], pad_id(self.tokenizer))
        labels = pad([lab for _, lab in rows], IGNORE)
        attention_mask = pad([[1] * len(ids) for ids, _ in rows], 0)
        return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}

    @staticmethod
    def tokens_in(batch: dict) -> int:
        return int(batch["attention_mask"].sum())

    def loss(self, model, batch: dict) -> torch.Tensor:
        return model(**batch).loss

    @torch.no_grad()
    def evaluate(self, model) -> dict:
        """Mean held-out loss over `eval_samples` fixed held-out examples."""
        losses = []
        n, m = self.eval_count(), self.cfg.micro_batch
        for start in range(0, n, m):
            batch = self.batch(HELDOUT, list(range(start, min(start + m, n))))
            losses.append(float(model(**batch).loss))
        return {"eval_loss": sum(losses) / len(losses)}
