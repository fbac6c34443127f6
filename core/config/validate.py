"""Cross-field checks of a composed config; every problem is collected, none raised early."""
from __future__ import annotations

from pathlib import Path

from core.config.schema import BatonConfig
from core.config.nodes_check import node_problems
from core.config.tiers_check import selective_problems, tier_problems

STAGES = ("cpt", "sft", "rm", "rl")
CORRECTIONS = ("none", "tis", "mis")
ENV_TASKS = ("answer", "program")
CRITERIA = ("latest", "best_score", "entropy_floor", "entropy_tolerance", "study")
"""Handoff selection criteria (implemented in `handoff.selection`)."""


def problems(cfg: BatonConfig) -> list[str]:
    found: list[str] = []
    s, p = cfg.stage, cfg.parallel
    if s.name not in STAGES:
        found.append(f"stage.name={s.name!r}: expected one of {', '.join(STAGES)}")
    if p.world_size < 1:
        found.append(f"parallel.world_size={p.world_size}: expected >= 1")
    if p.zero_stage not in (0, 1, 2, 3):
        found.append(f"parallel.zero_stage={p.zero_stage}: expected 0, 1, 2 or 3")
    if p.backend not in ("auto", "gloo", "nccl"):
        found.append(f"parallel.backend={p.backend!r}: expected auto, gloo or nccl")
    for key in ("max_steps", "save_every", "keep_last", "global_batch", "micro_batch", "seq_len",
                "eval_every", "eval_samples"):
        if getattr(s, key) < 1:
            found.append(f"stage.{key}={getattr(s, key)}: expected >= 1")
    found += _keep_best_problems(s)
    per_step = s.micro_batch * max(p.world_size, 1)
    # micro_batch < 1 is reported above; dividing by it would only add a ZeroDivisionError.
    if s.micro_batch >= 1 and s.global_batch % per_step:
        found.append(
            f"stage.global_batch={s.global_batch} is not divisible by stage.micro_batch * "
            f"parallel.world_size = {s.micro_batch} * {p.world_size}; pick a global_batch that is a "
            f"multiple of {per_step} so gradient accumulation stays whole")
    if cfg.model.path is not None and not str(cfg.model.path).strip():
        found.append("model.path='': an empty path; expected a local Hugging Face causal-LM "
                     "directory, or model.path=null for the built-in model")
    elif cfg.model.path is not None and not (Path(cfg.model.path) / "config.json").is_file():
        found.append(f"model.path={cfg.model.path!r}: no config.json there; expected a local "
                     "Hugging Face causal-LM directory (or model.path=null for the built-in model)")
    if cfg.resume is not None and not str(cfg.resume).strip():
        found.append("resume='': an empty path; expected 'latest', null or a checkpoint directory")
    elif cfg.resume not in (None, "latest") and not Path(cfg.resume).is_dir():
        found.append(f"resume={cfg.resume!r}: no such checkpoint directory; expected 'latest', "
                     "null or a path like <run.dir>/<stage>/checkpoints/step-000010")
    carried = [k for k in ("init_optimizer", "init_scheduler", "init_rng") if getattr(s, k)]
    if carried and s.init_from is None:
        found.append(f"stage.{carried[0]}=true needs stage.init_from=<checkpoint> to carry from")
    if s.name == "rm" and (s.init_optimizer or s.init_scheduler):
        found.append("stage.init_optimizer/init_scheduler=true for stage rm: the reward model adds "
                     "a new head, so the policy's optimizer state does not fit; set "
                     "pipeline.handoffs.sft_rm.carry.optimizer=false / scheduler=false")
    if s.init_from is not None:
        found += _checkpoint_dir_problems("stage.init_from", s.init_from)
    if s.seq_len > cfg.model.max_position_embeddings and cfg.model.path is None:
        found.append(f"stage.seq_len={s.seq_len} exceeds model.max_position_embeddings="
                     f"{cfg.model.max_position_embeddings}")
    if s.name == "rl":
        found += _rl_problems(s, p.zero_stage)
    if not 0.0 < cfg.data.heldout_fraction < 1.0:
        found.append(f"data.heldout_fraction={cfg.data.heldout_fraction}: expected in (0, 1)")
    found += _handoff_problems(cfg)
    found += _pipeline_stage_problems(cfg.pipeline.stages)
    found += _store_problems(cfg)
    from core.config.signing_key import key_problems  # must hold a key (never printed)
    found += key_problems(cfg.ckpt.signing_key_env)
    found += _ckpt_problems(cfg.ckpt) + _placement_problems(cfg)
    found += _rl_role_problems(cfg.rl)
    found += _repro_problems(cfg.repro)
    found += _study_problems(cfg.study)
    return found


# What each stage records at an evaluation step (stages.*.evaluate), for stage.keep_best_metric.
# Some depend on the data (eval_accuracy on the built-in tasks; pass@k with reward functions):
# a checkpoint saved without its metric is kept by keep_last alone (ckpt.retention).
EVAL_METRICS = {"cpt": ("eval_loss",), "sft": ("eval_loss", "eval_accuracy"),
                "rm": ("eval_loss", "eval_accuracy", "eval_pref_entropy"),
                "rl": ("eval_reward", "eval_accuracy", "eval_pass_at_1", "eval_pass_at_4")}


def _keep_best_problems(s) -> list[str]:
    if s.keep_best == 0:
        return []
    found = [] if s.keep_best > 0 else [f"stage.keep_best={s.keep_best}: expected >= 0 (0: off)"]
    if s.keep_best_mode not in ("min", "max"):
        found.append(f"stage.keep_best_mode={s.keep_best_mode!r}: expected min (lower is better) "
                     "or max (higher is better)")
    known = EVAL_METRICS.get(s.name, ())
    if known and s.keep_best_metric not in (*known, "loss"):
        found.append(f"stage.keep_best_metric={s.keep_best_metric!r}: stage {s.name} records "
                     f"{', '.join(known)} at an evaluation step, and loss at every step; pick one")
    elif s.keep_best_metric.startswith("eval_") and s.eval_every >= 1 and s.save_every % s.eval_every:
        found.append(f"stage.keep_best_metric={s.keep_best_metric}: with stage.save_every="
                     f"{s.save_every} and stage.eval_every={s.eval_every}, most checkpoints are saved "
                     "at a step without an evaluation; make save_every a multiple of eval_every")
    return found


def _placement_problems(cfg: BatonConfig) -> list[str]:
    """Where checkpoint copies go (ckpt.tiers) and which nodes the workers span."""
    return (tier_problems(cfg.ckpt.tiers, cfg.stage.save_every)
            + selective_problems(cfg.ckpt, cfg.parallel.zero_stage)
            + node_problems(cfg.parallel, cfg.ckpt.tiers, cfg.ckpt.selective))


def _study_problems(st) -> list[str]:
    found = [f"study.{key}={getattr(st, key)}: expected >= {low}"
             for key, low in (("rl_steps", 1), ("workers", 1), ("bootstrap", 100))
             if getattr(st, key) < low]
    if st.steps is not None and len(set(st.steps)) < 3:
        found.append(f"study.steps={list(st.steps)}: a study needs at least 3 distinct checkpoint "
                     "steps to correlate anything; list 3 or more, or study.steps=null for all")
    return found


def _repro_problems(r) -> list[str]:
    found = []
    if r.mode not in ("portable", "native"):
        found.append(f"repro.mode={r.mode!r}: expected portable (the same bytes on any x86 CPU) "
                     "or native (this CPU's fastest kernels)")
    if r.isa not in ("avx2", "baseline"):
        found.append(f"repro.isa={r.isa!r}: expected avx2 (any CPU with AVX2) or baseline "
                     "(any x86-64 CPU, slower)")
    if r.threads < 1:
        found.append(f"repro.threads={r.threads}: expected >= 1 intra-op thread per process")
    return found


def _ckpt_problems(c) -> list[str]:
    found = []
    if c.mode not in ("async", "sync"):
        found.append(f"ckpt.mode={c.mode!r}: expected async (the default: training waits only "
                     "for the staging copy) or sync (training waits for the whole save)")
    if c.snapshot not in ("lazy", "eager"):
        found.append(f"ckpt.snapshot={c.snapshot!r}: expected lazy (the default: the staging "
                     "copy overlaps the next forward and backward) or eager (the save call copies)")
    if c.saver not in ("thread", "process"):
        found.append(f"ckpt.saver={c.saver!r}: expected thread (the default: a saver thread in "
                     "the training process) or process (a saver process of its own)")
    if c.writer not in ("auto", "native", "python"):
        found.append(f"ckpt.writer={c.writer!r}: expected auto, native or python")
    if c.max_in_flight < 1:
        found.append(f"ckpt.max_in_flight={c.max_in_flight}: expected >= 1 (saves written at "
                     "once; each holds one staging copy of the state)")
    if c.hash not in ("auto", "sha256", "xxh3-128"):
        found.append(f"ckpt.hash={c.hash!r}: expected auto, sha256 or xxh3-128")
    if c.hash_threads < 1:
        found.append(f"ckpt.hash_threads={c.hash_threads}: expected >= 1")
    return found


def _pipeline_stage_problems(stages: list[str]) -> list[str]:
    unknown = [name for name in stages if name not in STAGES]
    if not stages or unknown or len(set(stages)) != len(stages):
        return [f"pipeline.stages={list(stages)}: expected one or more distinct stages among "
                f"{', '.join(STAGES)}, in pipeline order (e.g. baton run --stages cpt,sft)"]
    return []


def _handoff_problems(cfg: BatonConfig) -> list[str]:
    found = []
    for name, h in cfg.pipeline.handoffs.items():
        key = f"pipeline.handoffs.{name}"
        if h.selection.criterion not in CRITERIA:
            found.append(f"{key}.selection.criterion={h.selection.criterion!r}: expected one of "
                         f"{', '.join(CRITERIA)}")
        if h.selection.criterion == "study" and (h.from_stage, h.to_stage) != ("sft", "rl"):
            found.append(f"{key}.selection.criterion=study: a selection study measures SFT "
                         f"checkpoints as RL starts, not {h.from_stage} -> {h.to_stage}; use it "
                         "only at pipeline.handoffs.sft_rl")
        if h.from_stage not in STAGES or h.to_stage not in STAGES:
            found.append(f"{key}: from_stage={h.from_stage!r} to_stage={h.to_stage!r}; expected "
                         f"stages among {', '.join(STAGES)}")
        if h.role not in ("policy", "reward_model"):
            found.append(f"{key}.role={h.role!r}: expected policy or reward_model")
        if h.role == "reward_model" and (h.carry.optimizer or h.carry.scheduler or h.carry.rng):
            found.append(f"{key}.carry: a reward model is used frozen downstream; only weights "
                         "carry (set optimizer, scheduler and rng to false)")
        sel = h.selection
        if sel.probe_prompts < 1 or sel.samples_per_prompt < 1 or not 1 <= sel.k <= sel.samples_per_prompt:
            found.append(f"{key}.selection: probe_prompts={sel.probe_prompts} samples_per_prompt="
                         f"{sel.samples_per_prompt} k={sel.k}; expected probe_prompts >= 1 and "
                         "1 <= k <= samples_per_prompt (pass@k draws k of the samples)")
        if h.to_stage == "rm" and (h.carry.optimizer or h.carry.scheduler):
            found.append(f"{key}.carry.optimizer/scheduler=true: the reward model adds a new head, "
                         "so the policy's optimizer state does not fit; set them to false")
    return found


def _rl_role_problems(rl) -> list[str]:
    found = []
    if rl.rollout.actors < 1:
        found.append(f"rl.rollout.actors={rl.rollout.actors}: expected >= 1 rollout-engine actor")
    if rl.rollout.spares < 0:
        found.append(f"rl.rollout.spares={rl.rollout.spares}: expected >= 0 standby engines")
    for key in ("role_retries", "trainer_restarts"):
        if getattr(rl, key) < 0:
            found.append(f"rl.{key}={getattr(rl, key)}: expected >= 0")
    address = rl.ray.address
    if address is not None and (":" not in str(address) or not str(address).rsplit(":", 1)[1].isdigit()):
        found.append(f"rl.ray.address={address!r}: expected host:port of a running Ray cluster's "
                     "GCS (e.g. 127.0.0.1:6379), or null to start a local instance with the stage")
    if rl.replay_journal is not None and not Path(rl.replay_journal).is_dir():
        found.append(f"rl.replay_journal={rl.replay_journal!r}: no such directory; expected the "
                     "journal/ directory of an RL run (<run.dir>/rl/journal)")
    found += _env_problems(rl.env, rl.faults)
    if rl.correction not in CORRECTIONS:
        found.append(f"rl.correction={rl.correction!r}: expected one of {', '.join(CORRECTIONS)} "
                     "(none, truncated or masked importance sampling)")
    if rl.max_staleness < 0:
        found.append(f"rl.max_staleness={rl.max_staleness}: expected >= 0 (0: on-policy)")
    elif rl.max_staleness > 0 and rl.correction == "none":
        found.append(f"rl.max_staleness={rl.max_staleness} with rl.correction='none': samples up to "
                     f"{rl.max_staleness} policy versions old are off-policy; set rl.correction=tis "
                     "(or mis) so each is weighted by π_trainer/π_behaviour")
    if not rl.correction_cap >= 1:  # also NaN
        found.append(f"rl.correction_cap={rl.correction_cap}: expected >= 1 (the largest "
                     "importance weight π_trainer/π_rollout a token keeps)")
    return found


def _env_problems(env, faults) -> list[str]:
    found = []
    if env.task not in ENV_TASKS:
        found.append(f"rl.env.task={env.task!r}: expected answer (the checker reads the text) or "
                     "program (the environment role runs it in a sandbox)")
    if not env.timeout_s > 0 or env.cpu_s < 1 or env.memory_mb < 64:
        found.append(f"rl.env.timeout_s={env.timeout_s} rl.env.cpu_s={env.cpu_s} rl.env.memory_mb="
                     f"{env.memory_mb}: expected timeout_s > 0, cpu_s >= 1 and memory_mb >= 64 "
                     "(a Python interpreter needs about 20 MB to start)")
    elif env.timeout_s < 2 * env.cpu_s:
        found.append(f"rl.env.timeout_s={env.timeout_s} with rl.env.cpu_s={env.cpu_s}: expected "
                     "timeout_s >= 2 * cpu_s, so that a program that computes reaches its CPU limit "
                     "(the policy's failure) before the wall-clock one even on a busy machine")
    if env.retries < 0:
        found.append(f"rl.env.retries={env.retries}: expected >= 0")
    if not 0 <= env.alert_rate <= 1:
        found.append(f"rl.env.alert_rate={env.alert_rate}: expected a share between 0 and 1")
    rates = {k: getattr(faults, k) for k in ("env_crash_rate", "env_timeout_rate", "env_infra_rate")}
    bad = [f"rl.faults.{k}={v}" for k, v in rates.items() if not 0 <= v <= 1]
    if bad or sum(rates.values()) > 1:
        found.append(f"{' '.join(bad) or 'rl.faults.env_*_rate'}: expected shares between 0 and 1 "
                     f"that add up to at most 1 (they add up to {sum(rates.values()):g})")
    elif sum(rates.values()) > 0 and env.task != "program":
        found.append(f"rl.faults.env_*_rate set with rl.env.task={env.task!r}: environment faults "
                     "are injected into the sandbox, which only rl.env.task=program runs")
    return found


def _rl_problems(s, zero_stage: int) -> list[str]:
    found = []
    if zero_stage == 3:
        found.append("parallel.zero_stage=3 with stage rl: the trainer syncs the full policy "
                     "from rank 0 to the rollout actors, which ZeRO-3 partitions across ranks; "
                     "use parallel.zero_stage=0, 1 or 2 for RL")
    if s.group_size < 2:
        found.append(f"stage.group_size={s.group_size}: expected >= 2 (advantages are "
                     "normalised within a group, a group of one has none)")
    if s.temperature <= 0:
        found.append(f"stage.temperature={s.temperature}: expected > 0 (rollouts are sampled)")
    if s.max_new_tokens < 1:
        found.append(f"stage.max_new_tokens={s.max_new_tokens}: expected >= 1")
    if s.kl_target is not None and (s.kl_target <= 0 or s.kl_horizon < 1):
        found.append(f"stage.kl_target={s.kl_target} stage.kl_horizon={s.kl_horizon}: expected "
                     "kl_target > 0 and kl_horizon >= 1 (or kl_target=null for a fixed kl_coef)")
    for key in ("reference_from", "reward_model_from"):
        value = getattr(s, key)
        if value is not None:
            found += _checkpoint_dir_problems(f"stage.{key}", value)
    return found


def _checkpoint_dir_problems(key: str, value: str) -> list[str]:
    """Existence only; what is inside is checked by stages.preflight before workers start."""
    path = Path(value)
    if not str(value).strip():  # Path("") is the current directory: never what was meant
        return [f"{key}='': an empty path; expected a checkpoint directory, or {key}=null"]
    if path.is_dir():
        return []
    if path.is_file() and path.name == "latest":
        return [f"{key}={value!r} is the `latest` pointer file, not a checkpoint directory; pass "
                f"the directory it names: {key}={path.parent / path.read_text().strip()}"]
    return [f"{key}={value!r}: no such checkpoint directory; expected a path like "
            "<run.dir>/<stage>/checkpoints/step-000010"]


def _store_problems(cfg: BatonConfig) -> list[str]:
    if not cfg.store.url:
        return []
    from core.config.secrets import redact_url
    from core.config.store_url import url_problem

    problem = url_problem(cfg.store.url)
    return [f"store.url={str(redact_url(cfg.store.url))!r}: {problem}"] if problem else []
