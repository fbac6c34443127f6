"""Schema of your own data (`data.*`, stages.data) and reward (`rl.reward.*`,
stages.data.rewards): docs/own_data.md. Kept apart from core.config.schema, which
imports these classes."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional


@dataclass
class DataKeysConfig:
    """Role -> your column name; a role left null is read from the column of its own name
    (stages.data.formats says which roles each format reads)."""

    text: Optional[str] = None
    prompt: Optional[str] = None
    completion: Optional[str] = None
    messages: Optional[str] = None
    chosen: Optional[str] = None
    rejected: Optional[str] = None
    answer: Optional[str] = None
    """RL's ground truth, given to your reward function."""


@dataclass
class DataFilesConfig:
    """One dataset on disk: a file, a glob of files or a directory (stages.data.files)."""

    path: Optional[str] = None
    """JSON Lines, JSON, Parquet, a `datasets.save_to_disk` directory, or a glob of files."""
    format: Optional[str] = None
    """text | prompt_completion | messages | preference | prompts; null: the stage's usual
    one (cpt text, sft prompt_completion, rm preference, rl prompts)."""
    keys: DataKeysConfig = field(default_factory=DataKeysConfig)
    """data.<stage>.train.keys.<role>=<your column>."""


@dataclass
class StageDataConfig:
    """A stage's own data; with no train.path the stage trains on the built-in tasks."""

    train: DataFilesConfig = field(default_factory=DataFilesConfig)
    eval: DataFilesConfig = field(default_factory=DataFilesConfig)
    """The held-out set; with no eval.path, `eval_fraction` of train is held out."""
    eval_fraction: float = 0.05
    """Share of train rows held out (seeded by `seed`) when eval.path is not given."""


@dataclass
class DataConfig:
    max_operand: int = 9
    """Operands of the synthetic arithmetic tasks are drawn from [0, max_operand]."""
    heldout_fraction: float = 0.1
    """Share of operand pairs reserved for the held-out split."""
    cpt: StageDataConfig = field(default_factory=StageDataConfig)
    sft: StageDataConfig = field(default_factory=StageDataConfig)
    rm: StageDataConfig = field(default_factory=StageDataConfig)
    rl: StageDataConfig = field(default_factory=StageDataConfig)
    max_length: Optional[int] = None
    """Longest tokenized row of your data (null: stage.seq_len)."""
    truncation: str = "error"
    """A row longer than max_length: error (refused, naming the row) | left | right."""
    loss_on: str = "completion"
    """SFT loss on completion (assistant) tokens only, or on all tokens."""
    allow_changed: bool = False
    """Resume although a dataset's content changed since the checkpoint (recorded)."""
    cache_dir: Optional[str] = None
    """Where tokenized datasets are cached, keyed by content (null: <run.dir>/data_cache)."""


@dataclass
class RewardFunctionConfig:
    """One reward function (verl's custom_reward_function shape, stages.data.rewards)."""

    path: Optional[str] = None
    """A Python file that defines the function."""
    name: str = "compute_score"
    """The function in `path`: fn(data_source, solution_str, ground_truth, extra_info)."""
    module: Optional[str] = None
    """Instead of path: an importable 'pkg.module:function'."""
    weight: float = 1.0


@dataclass
class RlRewardConfig:
    """Your reward for RL on your own prompts (data.rl)."""

    functions: list[RewardFunctionConfig] = field(default_factory=list)
    """Summed with their weights; they replace the built-in checker."""
    rm_weight: Optional[float] = None
    """Weight of the reward model from the RM stage (stage.reward_model_from) added to the
    functions' sum; null: stage.reward_model_weight."""
    timeout_s: float = 10.0
    """A call running longer is an environment failure (retried, then the group dropped)."""
    pass_threshold: float = 1.0
    """A sample passes (pass@k) when its reward from the functions reaches this."""
