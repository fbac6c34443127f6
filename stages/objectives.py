"""CPT and SFT objectives: how a micro-batch is built and what its loss is.

Kept flat on purpose (torchtune recipes): each objective is a small class with
`batch(split, indices)`, `loss(model, batch)` and `evaluate(model)`.
"""
from __future__ import annotations

import torch

from stages.tasks import HELDOUT, ArithmeticTasks

IGNORE = -100


def _pad(rows: list[list[int]], value: int) -> torch.Tensor:
    width = max(len(r) for r in rows)
    return torch.tensor([r + [value] * (width - len(r)) for r in rows], dtype=torch.long)


class CausalLMObjective:
    name = "lm"

    def __init__(self, stage_cfg, tokenizer, tasks: ArithmeticTasks):
        self.cfg, self.tokenizer, self.tasks = stage_cfg, tokenizer, tasks

    def dataset_size(self, split: str) -> int:
        return self.tasks.size(split)

    def examples(self, split: str, indices: list[int]) -> list[tuple[list[int], list[int]]]:
        """(input ids, labels) per example; labels use IGNORE where no loss is taken."""
        raise NotImplementedError

    def batch(self, split: str, indices: list[int]) -> dict:
        rows = self.examples(split, indices)
        input_ids = _pad([ids for ids, _ in rows], self.tokenizer.pad_token_id)
        labels = _pad([lab for _, lab in rows], IGNORE)
        attention_mask = _pad([[1] * len(ids) for ids, _ in rows], 0)
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
        n, m = self.cfg.eval_samples, self.cfg.micro_batch
        for start in range(0, n, m):
            batch = self.batch(HELDOUT, list(range(start, min(start + m, n))))
            losses.append(float(model(**batch).loss))
        return {"eval_loss": sum(losses) / len(losses)}


class CptObjective(CausalLMObjective):
    """Next-token loss on packed lines of solved problems."""

    name = "cpt"

    def examples(self, split, indices):
        rows = []
        for index in indices:
            text = self.tasks.corpus_text(split, index, min_chars=self.cfg.seq_len)
            ids = [self.tokenizer.bos_token_id] + self.tokenizer(text)["input_ids"]
            ids = ids[: self.cfg.seq_len]
            rows.append((ids, list(ids)))
        return rows


class SftObjective(CausalLMObjective):
    """Loss on answer tokens only: the prompt is context, never a target."""

    name = "sft"

    def examples(self, split, indices):
        rows = []
        for index in indices:
            prompt, answer = self.tasks.sft_example(split, index)
            p_ids = [self.tokenizer.bos_token_id] + self.tokenizer(prompt)["input_ids"]
            a_ids = self.tokenizer(answer)["input_ids"] + [self.tokenizer.eos_token_id]
            ids = (p_ids + a_ids)[: self.cfg.seq_len]
            labels = ([IGNORE] * len(p_ids) + a_ids)[: self.cfg.seq_len]
            rows.append((ids, labels))
        return rows


OBJECTIVES = {"cpt": CptObjective, "sft": SftObjective}
