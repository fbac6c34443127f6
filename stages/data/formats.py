"""Row formats a stage accepts, the roles (columns) each reads, and the stage defaults.

The shapes are the ones TRL, OpenRLHF and verl accept: `text` rows for continued
pre-training, `prompt`/`completion` or chat `messages` for SFT, `prompt`/`chosen`/
`rejected` preference pairs for reward modelling, and `prompt` + `answer` (ground truth)
for RL, each column renamable through `data.<stage>.train.keys.<role>=<column>`.
"""
from __future__ import annotations

TEXT, PROMPT_COMPLETION, MESSAGES, PREFERENCE, PROMPTS = (
    "text", "prompt_completion", "messages", "preference", "prompts")

ROLES = {TEXT: ("text",), PROMPT_COMPLETION: ("prompt", "completion"), MESSAGES: ("messages",),
         PREFERENCE: ("prompt", "chosen", "rejected"), PROMPTS: ("prompt", "answer")}
"""Columns each format needs (RL's other columns go to the reward function as extras)."""
OPTIONAL_ROLES = {PREFERENCE: ("prompt",)}
"""Roles a format reads when present: preference pairs may carry the prompt inside
chosen/rejected (whole conversations)."""
ALL_ROLES = ("text", "prompt", "completion", "messages", "chosen", "rejected", "answer")

STAGE_FORMATS = {"cpt": (TEXT,), "sft": (PROMPT_COMPLETION, MESSAGES, TEXT),
                 "rm": (PREFERENCE,), "rl": (PROMPTS,)}
"""Formats each stage trains on; the first is its default."""


def stage_format(stage: str, configured: str | None) -> str:
    return configured or STAGE_FORMATS[stage][0]


def column_of(keys, role: str) -> str:
    """The user's column for `role` (data.<stage>.<split>.keys), else the role's own name."""
    return str(getattr(keys, role, None) or role)
