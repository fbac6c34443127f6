"""Typed schema of baton's configuration; values live in `conf/*.yaml`.

Every field carries a docstring-style comment; checks that span fields live in
`core.config.validate` so that all errors are reported at once.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from core.config.data_schema import DataConfig, RlRewardConfig
from core.config.tiers_schema import SelectiveConfig, TiersConfig


@dataclass
class RunConfig:
    dir: str = "runs/default"
    """Run home: checkpoints, lineage.db, mlflow.db all live under it (made absolute)."""
    name: str = "baton"
    """Human name of the pipeline run, shown in lineage and MLflow."""


@dataclass
class ModelConfig:
    path: Optional[str] = None
    """A local Hugging Face causal-LM directory; null builds the tiny built-in model."""
    hidden_size: int = 128
    """Width of the built-in Llama model."""
    intermediate_size: int = 256
    """MLP width of the built-in model."""
    num_hidden_layers: int = 2
    """Decoder layers of the built-in model."""
    num_attention_heads: int = 4
    """Attention heads of the built-in model."""
    num_key_value_heads: int = 2
    """KV heads (grouped-query attention) of the built-in model."""
    max_position_embeddings: int = 64
    """Longest sequence the built-in model accepts."""
    chat_template: Optional[str] = None
    """Chat template for `messages` data: an inline Jinja string or a file; null: the
    tokenizer's own."""


@dataclass
class ParallelConfig:
    world_size: int = 1
    """Number of data-parallel worker processes."""
    zero_stage: int = 0
    """DeepSpeed ZeRO stage 0-3."""
    backend: str = "auto"
    """torch.distributed backend: auto (nccl with GPUs, else gloo), gloo or nccl."""
    nodes: int = 1
    """Machines the workers span; world_size ranks split evenly, one launcher per node."""
    node_rank: int = 0
    """This launcher's node, 0..nodes-1 (names its launch files and its memory tier)."""
    rdzv_endpoint: Optional[str] = None
    """host:port of torchrun's c10d rendezvous (required when nodes > 1): the same on every
    node, typically node 0's address."""


@dataclass
class StageConfig:
    name: str = "cpt"
    """Objective: cpt, sft, rm or rl."""
    max_steps: int = 20
    """Optimizer steps to train (counted from step 0, including resumed ones)."""
    save_every: int = 10
    """Save a complete checkpoint every N optimizer steps (and at the last step)."""
    keep_last: int = 3
    """Committed checkpoints to keep; the newest is never deleted."""
    keep_best: int = 0
    """Also keep the best N by `keep_best_metric` and `_mode` (min/max); 0: off (ckpt.retention)."""
    keep_best_metric: str = "eval_loss"
    keep_best_mode: str = "min"
    global_batch: int = 16
    """Samples per optimizer step across all ranks; constant when world_size changes."""
    micro_batch: int = 4
    """Samples per rank per forward/backward."""
    seq_len: int = 48
    """Tokens per CPT sample / max tokens per SFT example."""
    lr: float = 3.0e-3
    """Peak learning rate."""
    warmup_steps: int = 4
    """Linear warmup steps before linear decay to min_lr_ratio * lr."""
    min_lr_ratio: float = 0.1
    """Floor of the decay as a fraction of lr."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    grad_clip: float = 1.0
    """Gradient-norm clip (0 disables)."""
    eval_every: int = 10
    """Evaluate on the held-out split every N steps (and at the last step)."""
    eval_samples: int = 32
    """Held-out samples per evaluation."""
    eval_at_start: bool = False
    """Also evaluate before the first step (step 0 in metrics.jsonl): the stage's baseline."""
    init_from: Optional[str] = None
    """Checkpoint directory whose weights start this stage (null: the model directory)."""
    init_optimizer: bool = False
    """Also carry Adam moments from init_from (same layout: the handoff reshards first)."""
    init_scheduler: bool = False
    """Also carry the LR scheduler position from init_from."""
    init_rng: bool = False
    """Also carry each rank's RNG streams from init_from (else derived from seed, stage, rank)."""
    # -- RL (GRPO) ---------------------------------------------------------------------
    group_size: int = 8
    """RL: completions sampled per prompt; advantages are normalised within the group."""
    temperature: float = 1.0
    """RL: sampling temperature of rollouts (and of the entropy probe at handoffs)."""
    max_new_tokens: int = 4
    """RL: tokens generated per completion."""
    kl_coef: float = 0.05
    """RL: initial coefficient of the KL penalty to the frozen reference."""
    kl_target: Optional[float] = None
    """RL: adaptive KL controller target (null keeps kl_coef fixed)."""
    kl_horizon: int = 100
    """RL: adaptive KL controller horizon in steps."""
    reward_checker_weight: float = 1.0
    """RL: weight of the task checker's 0/1 reward."""
    reward_model_weight: float = 0.0
    """RL: weight of the trained reward model's score."""
    reference_from: Optional[str] = None
    """RL: checkpoint of the frozen reference policy (default: init_from)."""
    reward_model_from: Optional[str] = None
    """RL: reward-model checkpoint used when reward_model_weight > 0."""


@dataclass
class StoreConfig:
    url: Optional[str] = None
    """SQLAlchemy URL of the lineage store; null means sqlite:///<run.dir>/lineage.db."""


@dataclass
class MlflowConfig:
    tracking_uri: Optional[str] = None
    """MLflow tracking URI; null means sqlite:///<run.dir>/mlflow.db."""
    enabled: bool = True
    """Log runs, metrics and checkpoints to MLflow."""


@dataclass
class CkptConfig:
    mode: str = "async"
    """async: a save blocks training only while the state is copied into reusable staging
    buffers; writing, hashing, fsync and the commit run in the background. sync: the
    step waits for the whole save (docs/async_checkpoints.md)."""
    snapshot: str = "lazy"
    """async only. lazy: the save call records what to copy, and the staging copy runs while
    the next forward and backward run; the next optimizer step waits for what is left of it.
    eager: the save call itself copies the state (docs/async_checkpoints.md)."""
    saver: str = "thread"
    """async only. Where the background work of a save runs (structure pickle, writing,
    hashing, fsync, commit). thread: a thread of the training process, whose Python holds
    the GIL the training step needs; process: a saver process of its own that reads the
    staging buffers in shared memory and dies with its worker (docs/async_checkpoints.md)."""
    writer: str = "auto"
    """native: the C++ writer of csrc/ (multi-threaded pwrite + sha256 without the GIL);
    python: its pure-Python twin (same bytes, same hashes); auto: native when built."""
    max_in_flight: int = 1
    """Asynchronous saves being written at once (one staging copy each); a save beyond it
    waits for a free slot, and that wait is reported as stall."""
    hash: str = "auto"
    """Content hash per 16 MiB chunk in the manifest: auto (sha256 when manifests are
    signed, xxh3-128 otherwise: it detects corruption at a tenth of sha256's cost), sha256
    or xxh3-128 (docs/async_checkpoints.md)."""
    hash_threads: int = 2
    """Threads that write and hash chunks of a file in parallel."""
    direct: bool = False
    """O_DIRECT for the aligned parts of each file (native writer), bypassing the page cache."""
    signing_key_env: Optional[str] = None
    """Name of the environment variable holding an HMAC-SHA256 key (never the key itself).
    Set: every manifest written is signed, and one unsigned or signed with another key is
    refused before any of its checkpoint is read (docs/security.md). Null: no signatures."""
    selective: SelectiveConfig = field(default_factory=SelectiveConfig)
    """Write only the layers that changed enough (docs/tiers.md#selective-persistence)."""
    tiers: TiersConfig = field(default_factory=TiersConfig)
    """Copies in memory, on a peer and at a URL besides the run directory (docs/tiers.md)."""


@dataclass
class RayConfig:
    address: Optional[str] = None
    """An existing Ray cluster to run the RL roles on (e.g. "127.0.0.1:6379"); null starts a
    local instance with the stage, bound to 127.0.0.1 only, and stops it after."""
    dashboard: bool = False
    """Start Ray's dashboard with the local instance (127.0.0.1 only); off unless asked for."""


@dataclass
class RolloutConfig:
    actors: int = 1
    """Rollout-engine actors, each holding a policy copy. The batch and its samples do not
    depend on this number: prompts go to actors whole, each sample has its own seed."""
    spares: int = 1
    """Warm standby engines (started, model built, no weights): one takes over from a dead
    actor at the cost of a weight sync instead of a process restart. 0: wait for Ray to
    restart the dead actor."""


@dataclass
class RlFaultsConfig:
    """Fault injection (tests, drills): SIGKILL a role's process mid-step at this optimizer
    step (0-based; -1: never). Each fires once per run, not again after the role restarts."""

    kill_rollout_actor_at_step: int = -1
    kill_reward_actor_at_step: int = -1
    kill_trainer_at_step: int = -1
    env_crash_rate: float = 0.0
    """rl.env.task=program: the share of sandbox runs that crash before the program runs
    (SIGKILL), drawn per attempt from the run seed; likewise:"""
    env_timeout_rate: float = 0.0
    """... that hang without computing until the wall-clock limit;"""
    env_infra_rate: float = 0.0
    """... whose environment fails to start (an infrastructure error)."""


@dataclass
class RlEnvConfig:
    """The environment role: where the policy's output is executed (docs/rl_environment.md)."""

    task: str = "answer"
    """answer: the checker compares the completion with the sum. program: the completion is
    a Python program, run by the environment role in a fresh sandboxed process (own network
    namespace, rlimits, an audit hook, a scratch directory), and its output is checked."""
    timeout_s: float = 5.0
    """Wall-clock limit of one sandbox run."""
    cpu_s: int = 2
    """CPU seconds a program may use (RLIMIT_CPU)."""
    memory_mb: int = 256
    """Address space of a sandbox process (RLIMIT_AS)."""
    retries: int = 2
    """Environment failures of one sample retried, each in a fresh sandbox; when they run
    out, the sample's whole group is dropped from the step (recorded, never scored)."""
    alert_rate: float = 0.05
    """An `env_alert` event (journal, lineage, MLflow) when a step's environment failure
    rate exceeds this."""


@dataclass
class RlConfig:
    """RL roles on Ray, the rollout journal and replay (docs/rl_roles.md)."""

    ray: RayConfig = field(default_factory=RayConfig)
    reward: RlRewardConfig = field(default_factory=RlRewardConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    faults: RlFaultsConfig = field(default_factory=RlFaultsConfig)
    env: RlEnvConfig = field(default_factory=RlEnvConfig)
    role_retries: int = 3
    """Times a request to a dead rollout or reward actor is re-issued (after the actor's
    restart and weight re-sync) before the step fails."""
    trainer_restarts: int = 1
    """Times the launcher restarts killed trainer workers from the last RL checkpoint
    (catching up from the journal) before the stage fails."""
    replay_journal: Optional[str] = None
    """Replay: take every step's rollouts and rewards from this journal directory; no
    rollout or reward role is started (`baton rl replay`)."""
    replay_to_step: Optional[int] = None
    """Stop (and save) at this step instead of stage.max_steps (`baton rl replay --to-step`);
    max_steps stays, so the learning-rate schedule is the original run's."""
    correction: str = "none"
    """Importance correction for the gap between the rollout engine's log-probs (the
    behaviour policy) and the trainer's, on the policy-gradient term: none; tis (truncated
    importance sampling: each token weighted by min(π_trainer/π_rollout, correction_cap));
    mis (masked: a token whose ratio exceeds the cap gets weight 0, the others their ratio)."""
    correction_cap: float = 2.0
    """The cap C of tis and mis (>= 1)."""
    max_staleness: int = 0
    """Asynchronous RL: a step's rollouts are requested up to this many policy versions
    ahead, so the rollout actors generate while the trainer updates; each sample keeps the
    version that generated it, and the correction (tis or mis, required) weights it by
    π_trainer/π_behaviour. 0: on-policy. Reproducible by `baton rl replay` from the
    journal, not by a re-run (docs/rl_async.md)."""
    batch_invariant: bool = False
    """Rollout engine and trainer compute the log-probs through one path, a forward of each
    whole sequence alone (batch of one, no padding), so they are bitwise equal; the engine
    computes them again after sampling, which costs time (docs/rl.md)."""


@dataclass
class ReproConfig:
    """How reproducible numerics are across machines (core.repro)."""

    mode: str = "portable"
    """portable: kernel dispatch pinned to one instruction-set level (`isa`) in MKL, ATen
    and oneDNN, fixed thread counts and deterministic algorithms, set for every process
    before torch loads, so a run on another x86 CPU gives the same bytes. native: the
    fastest kernels this CPU has; results depend on its instruction set."""
    isa: str = "avx2"
    """Portable level: avx2 (the same bytes on every CPU with AVX2, nearly native speed) or
    baseline (the same bytes on any x86-64 CPU, about 2x slower per step)."""
    threads: int = 1
    """Intra-op threads per process in portable mode (a reduction's order depends on it)."""


@dataclass
class DebugConfig:
    """Fault injection for tests of preemption and crash safety."""

    preempt_at_micro_step: int = -1
    """Rank 0 sends SIGTERM to the launcher after this global micro-step (-1: never)."""
    crash_in_save_at_step: int = -1
    """The save at this step SIGKILLs the worker after the data files, before the manifest."""
    fail_write_at_step: int = -1
    """The save at this step fails its first write on rank 0 with ENOSPC, as a full disk
    would (for tests where a small tmpfs cannot be mounted)."""


@dataclass
class SelectionConfig:
    criterion: str = "latest"
    """latest | best_score | entropy_floor | entropy_tolerance | study (see conf/selection/):
    study picks by the diagnostic that best predicted RL in the newest selection study."""
    score_metric: str = "accuracy"
    """Diagnostic used as the score; a leading '-' means lower is better (-heldout_loss)."""
    entropy_floor: float = 0.0
    """entropy_floor: candidates below this mean token entropy are ineligible."""
    score_tolerance: float = 0.0
    """entropy_tolerance: candidates within this of the best score are eligible."""
    probe_prompts: int = 16
    """Held-out probe prompts per candidate."""
    samples_per_prompt: int = 8
    """Samples per probe prompt at the rollout temperature (pass@k's n)."""
    k: int = 4
    """k of pass@k."""


@dataclass
class StudyConfig:
    """`baton study selection`: a short RL from each SFT checkpoint, correlated with the
    handoff's diagnostics (handoff.study)."""

    stage_run_id: Optional[int] = None
    """The SFT stage run whose checkpoints are studied; null: the newest completed one."""
    steps: Optional[list[int]] = None
    """Checkpoint steps to study (at least 3); null: every committed checkpoint."""
    rl_steps: int = 60
    """RL optimizer steps from each candidate (the same budget, seed and config for all);
    the outcome is the held-out reward after them."""
    workers: int = 2
    """Candidates whose RL runs at the same time (each in its own worker processes)."""
    bootstrap: int = 2000
    """Bootstrap resamples for the 95% intervals of the correlations."""


@dataclass
class CarryPolicy:
    """What crosses a stage boundary; everything not carried is reset (and recorded)."""

    weights: bool = True
    optimizer: bool = False
    """Adam moments; needs identical parameters on both sides (not SFT->RM: new head)."""
    scheduler: bool = False
    """LR scheduler position."""
    rng: bool = False
    """Per-rank RNG streams; when reset they are derived from (seed, stage, rank)."""


@dataclass
class HandoffConfig:
    from_stage: str = "cpt"
    to_stage: str = "sft"
    role: str = "policy"
    """What the chosen checkpoint becomes downstream: policy | reward_model."""
    selection: SelectionConfig = field(default_factory=SelectionConfig)
    carry: CarryPolicy = field(default_factory=CarryPolicy)


@dataclass
class PipelineConfig:
    stages: list[str] = field(default_factory=lambda: ["cpt", "sft", "rm", "rl"])
    """Stages in order; each after the first starts from handoffs into it."""
    parallel: dict[str, str] = field(default_factory=dict)
    """Stage -> conf/parallel/<name>.yaml (the layout usually changes at a boundary)."""
    overrides: dict[str, list[str]] = field(default_factory=dict)
    """Stage -> extra overrides for that stage only (e.g. ["stage.max_steps=40"])."""
    handoffs: dict[str, HandoffConfig] = field(default_factory=dict)
    """Boundary name -> how its checkpoint is selected and what carries."""


@dataclass
class BatonConfig:
    run: RunConfig = field(default_factory=RunConfig)
    seed: int = 1234
    """Root seed; every per-rank RNG is derived from (seed, stage, rank)."""
    resume: Optional[str] = None
    """null, 'latest' or a checkpoint directory to resume this stage from."""
    model: ModelConfig = field(default_factory=ModelConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    stage: StageConfig = field(default_factory=StageConfig)
    store: StoreConfig = field(default_factory=StoreConfig)
    mlflow: MlflowConfig = field(default_factory=MlflowConfig)
    ckpt: CkptConfig = field(default_factory=CkptConfig)
    rl: RlConfig = field(default_factory=RlConfig)
    repro: ReproConfig = field(default_factory=ReproConfig)
    debug: DebugConfig = field(default_factory=DebugConfig)
    pipeline: PipelineConfig = field(default_factory=PipelineConfig)
    study: StudyConfig = field(default_factory=StudyConfig)
