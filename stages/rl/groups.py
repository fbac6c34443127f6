"""One step's rollouts as the trainer consumes them, and their journal segment form.

A *group* is one prompt's samples: tokens, response mask, the engine's log-probs, both
reward components. A step's segment holds every group of the step in the sampler's
prompt order (sample-major within a prompt), plus what the trainer computed from them
(its own log-probs, the advantage and KL of each sample) and the step's events.
Tensors go to `tensors.safetensors` (exact bytes: a replay reads back the float64
rewards it trained on); everything else to `records.json`, readable by
`baton rl journal show`.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from stages.sampling import response_mask

FORMAT = "baton.rl-step/1"
TENSOR_KEYS = ("tokens", "mask", "rollout_logp", "checker", "rm", "trainer_logp", "advantage", "kl")


@dataclass
class Group:
    prompt_index: int
    prompt_ids: list[int]
    seeds: list[int]
    policy_version: int
    tokens: torch.Tensor
    mask: torch.Tensor
    rollout_logp: torch.Tensor
    checker: torch.Tensor
    rm: torch.Tensor | None
    served_by: dict
    env: list | None = None
    """rl.env.task=program: per sample, every sandbox attempt (stages.rl.environment)."""
    dropped: dict | None = None
    """Set when the environment role gave up on a sample: the group is not trained on."""

    def rewards(self, checker_weight: float, rm_weight: float) -> torch.Tensor:
        total = checker_weight * self.checker.double()
        if self.rm is not None:
            total = total + rm_weight * self.rm.double()
        return total


def group_from(result, request, score: dict, stop_ids) -> Group:
    return Group(request.prompt_index, list(request.prompt_ids), list(request.seeds),
                 result.policy_version, result.tokens, response_mask(result.tokens, stop_ids),
                 result.logp, score["checker"], score["rm"], dict(result.served_by))


def segment_of(step: int, kl_coef: float, groups: list[Group], trained: dict, events: list,
               weights: tuple[float, float]) -> tuple[dict, dict]:
    """(records, tensors) of step `step`'s segment; `trained[prompt]` holds the trainer's
    "trainer_logp" (G, T), "advantage" (G,) and "kl" (G,) of each group."""
    samples, rows = [], {k: [] for k in TENSOR_KEYS}
    for g in groups:
        # A dropped group was not trained on: NaN where the trainer's numbers would be.
        t = trained.get(g.prompt_index) or _untrained(g)
        rewards = g.rewards(*weights)
        for i, seed in enumerate(g.seeds):
            samples.append({
                "prompt_index": g.prompt_index, "sample": i, "seed": seed,
                "policy_version": g.policy_version, "served_by": g.served_by.get("actor"),
                "reward": None if g.dropped else {
                    "checker": float(g.checker[i]), "rm": None if g.rm is None else float(g.rm[i]),
                    "total": float(rewards[i])},
                "advantage": None if g.dropped else float(t["advantage"][i]),
                "kl": None if g.dropped else float(t["kl"][i]),
                "response_tokens": int(g.mask[i].sum()),
                **({"env": g.env[i]} if g.env else {})})
        rows["tokens"].append(g.tokens)
        rows["mask"].append(g.mask)
        rows["rollout_logp"].append(g.rollout_logp.float())
        rows["checker"].append(g.checker.double())
        rows["rm"].append(torch.full((len(g.seeds),), float("nan")) if g.rm is None else g.rm.float())
        rows["trainer_logp"].append(t["trainer_logp"].float())
        rows["advantage"].append(t["advantage"].float())
        rows["kl"].append(t["kl"].double())
    records = {"format": FORMAT, "step": step, "kl_coef": kl_coef, "events": events,
               "prompts": [{"prompt_index": g.prompt_index, "prompt_ids": g.prompt_ids,
                            "group_size": len(g.seeds), **({"dropped": g.dropped} if g.dropped else {})}
                           for g in groups],
               "samples": samples}
    return records, {k: torch.cat(v) for k, v in rows.items()}


def staleness_counts(step: int, groups: list[Group]) -> dict[str, int]:
    """{staleness: samples} of a 0-based step, staleness = step - the policy version that
    generated the sample (0: on-policy; rl.max_staleness bounds it)."""
    counts: dict[str, int] = {}
    for g in groups:
        key = str(step - g.policy_version)
        counts[key] = counts.get(key, 0) + len(g.seeds)
    return dict(sorted(counts.items(), key=lambda kv: int(kv[0])))


def staleness_total(per_step: list[dict | None]) -> dict[int, int]:
    """The run's {staleness: samples} from each step's `staleness_counts` (None: not recorded)."""
    total: dict[int, int] = {}
    for counts in per_step:
        for key, count in (counts or {}).items():
            total[int(key)] = total.get(int(key), 0) + count
    return dict(sorted(total.items()))


def _untrained(g: Group) -> dict:
    nan = float("nan")
    return {"trainer_logp": torch.full(g.tokens.shape, nan), "advantage": torch.full((len(g.seeds),), nan),
            "kl": torch.full((len(g.seeds),), nan, dtype=torch.float64)}


def groups_of(records: dict, tensors: dict) -> list[Group]:
    """The groups a committed segment holds, in the step's prompt order."""
    groups, start = [], 0
    by_prompt = {}
    for sample in records["samples"]:
        by_prompt.setdefault(sample["prompt_index"], []).append(sample)
    for prompt in records["prompts"]:
        n, samples = prompt["group_size"], by_prompt[prompt["prompt_index"]]
        rows = slice(start, start + n)
        rm = tensors["rm"][rows]
        groups.append(Group(prompt["prompt_index"], prompt["prompt_ids"], [s["seed"] for s in samples],
                            samples[0]["policy_version"], tensors["tokens"][rows],
                            tensors["mask"][rows], tensors["rollout_logp"][rows],
                            tensors["checker"][rows], None if torch.isnan(rm).all() else rm,
                            {"actor": samples[0]["served_by"]},
                            [s["env"] for s in samples] if "env" in samples[0] else None,
                            prompt.get("dropped")))
        start += n
    return groups


def trained_of(records: dict, tensors: dict) -> dict:
    """prompt index -> what the trainer computed, as journaled (compared on catch-up)."""
    out, start = {}, 0
    for prompt in records["prompts"]:
        rows = slice(start, start + prompt["group_size"])
        if not prompt.get("dropped"):  # a dropped group was not trained on
            out[prompt["prompt_index"]] = {k: tensors[k][rows] for k in ("trainer_logp", "advantage", "kl")}
        start += prompt["group_size"]
    return out
