"""SFT: supervised fine-tuning on prompt/answer pairs, loss on the answer only."""
from __future__ import annotations

import torch

from stages.objective import IGNORE, CausalLMObjective
from stages.tasks import HELDOUT


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

    @torch.no_grad()
    def evaluate(self, model) -> dict:
        """Held-out loss plus greedy exact-match accuracy: the SFT score used to select
        checkpoints (a handful of answer tokens per prompt keeps it cheap)."""
        from stages.sampling import greedy_accuracy

        result = super().evaluate(model)
        result["eval_accuracy"] = greedy_accuracy(model, self.tokenizer, self.tasks, HELDOUT,
                                                  self.cfg.eval_samples, self.cfg.max_new_tokens)
        return result
