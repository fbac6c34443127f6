"""SFT: supervised fine-tuning, loss on the answer (completion, assistant turns) only.

Built-in: arithmetic prompt/answer pairs; your data: prompt/completion or chat messages
(stages.data), with data.loss_on=all to train on every token.
"""
from __future__ import annotations

import torch

from stages.data.examples import BuiltinExamples
from stages.objective import CausalLMObjective
from stages.tasks import HELDOUT


class SftObjective(CausalLMObjective):
    """Loss on answer tokens only: the prompt is context, never a target."""

    name = "sft"

    @torch.no_grad()
    def evaluate(self, model) -> dict:
        """Held-out loss plus, on the built-in tasks, greedy exact-match accuracy: the SFT
        score used to select checkpoints (a handful of answer tokens per prompt keeps it
        cheap). Your data has no checker: its score is the held-out loss."""
        from stages.sampling import greedy_accuracy

        result = super().evaluate(model)
        if not isinstance(self.data, BuiltinExamples):
            return result
        result["eval_accuracy"] = greedy_accuracy(model, self.tokenizer, self.tasks, HELDOUT,
                                                  self.cfg.eval_samples, self.cfg.max_new_tokens)
        return result
