"""CPT: continued pre-training on packed lines of solved problems."""
from __future__ import annotations

from stages.objective import CausalLMObjective


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
