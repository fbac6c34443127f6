"""Reward modelling: a scalar head on the SFT backbone, trained on preference pairs.

Bradley–Terry loss -log σ(r_chosen - r_rejected). Chosen and rejected sequences are
`bos + prompt + answer + eos`; a micro-batch holds the chosen rows first and the
rejected rows after them, so one forward scores both.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from stages.objective import CausalLMObjective, pad, pad_id
from stages.tasks import HELDOUT


def bradley_terry(chosen: torch.Tensor, rejected: torch.Tensor) -> torch.Tensor:
    """Per-pair loss -log σ(r_c - r_r)."""
    return -F.logsigmoid(chosen - rejected)


def preference_entropy(chosen: torch.Tensor, rejected: torch.Tensor) -> torch.Tensor:
    """Binary entropy (nats) of p = σ(r_c - r_r) per pair: how undecided the RM is."""
    margin = chosen - rejected
    p, log_p, log_q = torch.sigmoid(margin), F.logsigmoid(margin), F.logsigmoid(-margin)
    return -(p * log_p + (1 - p) * log_q)


class RmObjective(CausalLMObjective):
    name = "rm"
    new_head = True  # the scalar `score` head starts fresh on the SFT policy's backbone

    @staticmethod
    def model_class(config):
        from transformers.models.auto.modeling_auto import MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING
        return MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING[type(config)]

    @classmethod
    def build_model(cls, model_dir):
        model, tokenizer = super().build_model(model_dir)
        if model.config.pad_token_id is None:
            # Hugging Face's sequence-classification heads find each row's last token by the
            # pad id and refuse batches without one; a tokenizer without a pad token pads
            # with EOS (stages.objective.pad_id), so the head reads the last token before it.
            model.config.pad_token_id = pad_id(tokenizer)
        return model, tokenizer

    def batch(self, split: str, indices: list[int]) -> dict:
        chosen, rejected = [], []
        for index in indices:
            good, bad = self.data.preference(split, index)
            chosen.append(good)
            rejected.append(bad)
        rows = chosen + rejected
        # Right padding with the pad id: the classification head reads the last non-pad token.
        return {"input_ids": pad(rows, pad_id(self.tokenizer)),
                "attention_mask": pad([[1] * len(r) for r in rows], 0)}

    @staticmethod
    def scores(model, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        rewards = model(**batch).logits.squeeze(-1).float()
        half = rewards.shape[0] // 2
        return rewards[:half], rewards[half:]

    def loss(self, model, batch: dict) -> torch.Tensor:
        return bradley_terry(*self.scores(model, batch)).mean()

    @torch.no_grad()
    def evaluate(self, model) -> dict:
        """Pairwise accuracy, loss and preference entropy over fixed held-out pairs."""
        n, m = self.eval_count(), self.cfg.micro_batch
        chosen, rejected = [], []
        for start in range(0, n, m):
            c, r = self.scores(model, self.batch(HELDOUT, list(range(start, min(start + m, n)))))
            chosen.append(c)
            rejected.append(r)
        c, r = torch.cat(chosen), torch.cat(rejected)
        return {"eval_loss": float(bradley_terry(c, r).mean()),
                "eval_accuracy": float((c > r).float().mean()),
                "eval_pref_entropy": float(preference_entropy(c, r).mean())}
