"""CPT: continued pre-training, next-token loss on every token.

Built-in: packed lines of solved problems; your data: `text` rows (stages.data).
"""
from __future__ import annotations

from stages.objective import CausalLMObjective


class CptObjective(CausalLMObjective):
    """Next-token loss on every token of each example."""

    name = "cpt"
