"""Which SFT checkpoint should RL start from: the analysis of a selection study.

Each of K candidate SFT checkpoints was measured before RL (the handoff diagnostics) and
then trained with RL from there. This module ranks the diagnostics by how well they
predicted the RL outcome, with bootstrap intervals, and writes the verdict. Pure: the
study's runner reads the runs and writes the files.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

from core.errors import BatonError
from handoff.study_stats import bootstrap_ci, kendall_tau_b, spearman


@dataclass(frozen=True)
class Diagnostic:
    name: str
    label: str
    good: int
    """+1 when a user would expect a higher value to make the better RL start, -1 lower."""


DIAGNOSTICS = (
    Diagnostic("sft_score", "SFT score (greedy held-out accuracy)", +1),
    Diagnostic("heldout_loss", "held-out loss", -1),
    Diagnostic("entropy", "mean token entropy of the policy's own samples", +1),
    Diagnostic("pass@1", "pass@1 at the rollout temperature", +1),
    Diagnostic("pass@k", "pass@k at the rollout temperature", +1),
    Diagnostic("reward_variance", "within-group reward variance p(1-p), mean over prompts", +1),
)
NAMES = tuple(d.name for d in DIAGNOSTICS)
TARGETS = ("final_reward", "gain")
LEVEL = 0.95
PASS_K = "k"  # the diagnostics key that keeps the k of pass@k; not itself a diagnostic
HANDOFF_KEYS = {"accuracy": "sft_score", "heldout_loss": "heldout_loss", "entropy": "entropy",
                "pass@1": "pass@1", "reward_variance": "reward_variance"}
_PASS_AT = re.compile(r"pass@(\d+)$")


def diagnostics_from_handoff_metrics(metrics: dict) -> dict:
    """The handoff's metric keys -> study names; `pass@<k>` (any k > 1) -> `pass@k`, k kept.

    Should a handoff record several k, the largest is the study's pass@k.
    """
    out = {name: float(metrics[key]) for key, name in HANDOFF_KEYS.items()
           if metrics.get(key) is not None}
    ks = [int(m.group(1)) for key in metrics if (m := _PASS_AT.match(key))]
    ks = [k for k in ks if k > 1 and metrics[f"pass@{k}"] is not None]
    if ks:
        out["pass@k"], out[PASS_K] = float(metrics[f"pass@{max(ks)}"]), float(max(ks))
    return out


def outcome(start_reward: float, final_reward: float) -> dict[str, float]:
    """A candidate's RL outcome: held-out reward before and after RL, and the gain."""
    return {"start_reward": float(start_reward), "final_reward": float(final_reward),
            "gain": float(final_reward) - float(start_reward)}


@dataclass
class CandidateResult:
    step: int
    checkpoint_id: int | None
    path: str
    diagnostics: dict[str, float]
    outcome: dict[str, float]

    def value(self, key: str) -> float:
        """A diagnostic or outcome value; NaN when this candidate did not record it."""
        found = self.outcome.get(key, self.diagnostics.get(key))
        return math.nan if found is None else float(found)


def _json(value: float) -> float | None:
    return None if value is None or math.isnan(value) else float(value)


@dataclass(frozen=True)
class Correlation:
    diagnostic: str
    target: str
    n: int
    spearman: float
    spearman_ci: tuple[float, float]
    kendall: float
    kendall_ci: tuple[float, float]

    @property
    def ci_excludes_zero(self) -> bool:
        lo, hi = self.spearman_ci
        return lo > 0 or hi < 0  # False for an undefined (NaN) interval

    def as_dict(self) -> dict:
        return {"diagnostic": self.diagnostic, "target": self.target, "n": self.n,
                "spearman": _json(self.spearman), "spearman_lo": _json(self.spearman_ci[0]),
                "spearman_hi": _json(self.spearman_ci[1]), "kendall": _json(self.kendall),
                "kendall_lo": _json(self.kendall_ci[0]), "kendall_hi": _json(self.kendall_ci[1])}


@dataclass
class StudyResult:
    correlations: list[Correlation]
    winner: Correlation | None
    winner_direction: int | None
    peak_score_step: int | None
    best_outcome_step: int | None
    peak_was_best: bool
    inversions: int
    n: int

    def correlation(self, diagnostic: str, target: str) -> Correlation | None:
        return next((c for c in self.correlations
                     if c.diagnostic == diagnostic and c.target == target), None)

    def as_dict(self) -> dict:
        return {"correlations": [c.as_dict() for c in self.correlations],
                "winner": self.winner.as_dict() if self.winner else None,
                "winner_direction": self.winner_direction,
                "peak_score_step": self.peak_score_step,
                "best_outcome_step": self.best_outcome_step,
                "peak_was_best": self.peak_was_best, "inversions": self.inversions, "n": self.n}


def _finite_pairs(candidates: list[CandidateResult], a: str, b: str) -> list[tuple[float, float]]:
    pairs = [(c.value(a), c.value(b)) for c in candidates]
    return [(x, y) for x, y in pairs if math.isfinite(x) and math.isfinite(y)]


def _correlate(candidates: list[CandidateResult], diagnostic: str, target: str, *,
               resamples: int, seed: int) -> Correlation:
    pairs = _finite_pairs(candidates, diagnostic, target)
    x, y = [p[0] for p in pairs], [p[1] for p in pairs]
    # One seed for every pair of columns: each correlation sees the same resampled
    # candidates, so their intervals are compared on equal terms.
    ci = dict(resamples=resamples, seed=seed, level=LEVEL)
    return Correlation(diagnostic, target, len(pairs), spearman(x, y),
                       bootstrap_ci(x, y, spearman, **ci), kendall_tau_b(x, y),
                       bootstrap_ci(x, y, kendall_tau_b, **ci))


def _winner(correlations: list[Correlation]) -> Correlation | None:
    # A rho of 0 predicts nothing: it must not become a winner with an arbitrary sign.
    defined = [c for c in correlations if c.target == "final_reward"
               and not math.isnan(c.spearman) and round(abs(c.spearman), 12) > 0]
    if not defined:
        return None

    def key(c: Correlation):
        width = c.spearman_ci[1] - c.spearman_ci[0]
        # rounded: two perfect predictors must tie, not differ in the last bit
        return (-round(abs(c.spearman), 12), width if math.isfinite(width) else math.inf,
                NAMES.index(c.diagnostic))
    return min(defined, key=key)


def _top_step(candidates: list[CandidateResult], key: str) -> int | None:
    """The step with the highest value of `key`; ties go to the later step."""
    scored = [(c.value(key), c.step) for c in candidates if math.isfinite(c.value(key))]
    return max(scored)[1] if scored else None


def _inversions(candidates: list[CandidateResult]) -> tuple[int, int]:
    """(discordant pairs, comparable pairs) of SFT score against post-RL reward."""
    pairs = _finite_pairs(candidates, "sft_score", "final_reward")
    discordant = sum(1 for i, (xi, yi) in enumerate(pairs) for xj, yj in pairs[i + 1:]
                     if (xi - xj) * (yi - yj) < 0)
    return discordant, len(pairs) * (len(pairs) - 1) // 2


def analyze(candidates: list[CandidateResult], *, resamples: int = 2000,
            seed: int = 0) -> StudyResult:
    if not candidates:
        raise BatonError("selection study: no candidates to analyze; a study needs the RL "
                         "outcome of at least 3 SFT checkpoints")
    steps = [c.step for c in candidates]
    if len(set(steps)) != len(steps):
        raise BatonError(f"selection study: candidate steps {sorted(steps)} repeat a step; "
                         "each candidate must be a distinct SFT checkpoint")
    present = [d.name for d in DIAGNOSTICS
               if any(math.isfinite(c.value(d.name)) for c in candidates)]
    correlations = [_correlate(candidates, name, target, resamples=resamples, seed=seed)
                    for name in present for target in TARGETS]
    winner = _winner(correlations)
    peak = _top_step(candidates, "sft_score")
    best = _top_step(candidates, "final_reward")
    reward = {c.step: c.value("final_reward") for c in candidates}
    # A peak that ties the best reward at another step was still a best start.
    peak_was_best = peak is not None and best is not None and reward[peak] == reward[best]
    return StudyResult(correlations, winner,
                       None if winner is None else (1 if winner.spearman > 0 else -1),
                       peak, best, peak_was_best, _inversions(candidates)[0], len(candidates))


def pick_by_study(candidates_metrics: list[tuple[int, dict]], diagnostic: str,
                  direction: int) -> int:
    """The study criterion: the step with the highest direction x diagnostic (ties: later)."""
    if direction not in (1, -1):
        raise BatonError(f"study direction={direction!r}: expected +1 (highest {diagnostic} "
                         f"wins) or -1 (lowest wins)")
    scored = [(direction * float(m[diagnostic]), step) for step, m in candidates_metrics
              if m.get(diagnostic) is not None and math.isfinite(float(m[diagnostic]))]
    if not scored:
        raise BatonError(f"selection study: no candidate has the diagnostic {diagnostic!r}; "
                         f"expected one of {', '.join(NAMES)} in every candidate's metrics")
    return max(scored)[1]


# The verdict ---------------------------------------------------------------------------

def display_name(name: str, candidates: list[CandidateResult]) -> str:
    """`pass@k` shown with its k (`pass@4`) when every candidate used the same k."""
    ks = {c.diagnostics.get(PASS_K) for c in candidates}
    if name == "pass@k" and len(ks) == 1 and None not in ks:
        return f"pass@{int(next(iter(ks)))}"
    return name


def _num(value: float | None, signed: bool = False) -> str:
    if value is None or math.isnan(value):
        return "—"
    return f"{value:+.2f}" if signed else f"{value:.3f}"


def _with_ci(value: float, ci: tuple[float, float]) -> str:
    if math.isnan(value):
        return "undefined"
    if math.isnan(ci[0]):
        return f"{_num(value, True)} [CI undefined]"
    return f"{_num(value, True)} [{_num(ci[0], True)}, {_num(ci[1], True)}]"


def _correlation_table(result: StudyResult, candidates: list[CandidateResult]) -> list[str]:
    lines = ["| diagnostic | expected good | n | Spearman ρ vs post-RL reward [95% CI] "
             "| Kendall τ vs post-RL reward [95% CI] | Spearman ρ vs gain [95% CI] |",
             "|---|---|---|---|---|---|"]
    for d in DIAGNOSTICS:
        final, gain = result.correlation(d.name, "final_reward"), result.correlation(d.name, "gain")
        if final is None:
            continue
        lines.append(f"| {display_name(d.name, candidates)} | {'higher' if d.good > 0 else 'lower'} "
                     f"| {final.n} | {_with_ci(final.spearman, final.spearman_ci)} "
                     f"| {_with_ci(final.kendall, final.kendall_ci)} "
                     f"| {_with_ci(gain.spearman, gain.spearman_ci)} |")
    return lines


def _evidence(winner: Correlation, k: int) -> str:
    if math.isnan(winner.spearman_ci[0]):
        return (f"The bootstrap interval is undefined (most resamples of the {k} candidates "
                "drew a constant side): there is no evidence either way.")
    if winner.ci_excludes_zero:
        return (f"The interval excludes 0, but with only K = {k} candidates this is a lead "
                "to confirm on another study, not a rule.")
    return (f"The interval includes 0: with only K = {k} candidates the evidence is weak, and "
            "this study does not show that it predicts the RL outcome at all.")


def _winner_paragraph(result: StudyResult, candidates: list[CandidateResult]) -> str:
    w = result.winner
    if w is None:
        return ("No diagnostic's rank correlation with the post-RL reward is defined (the "
                "diagnostics or the outcomes are constant across the candidates): this study "
                "cannot name a predictor.")
    d = DIAGNOSTICS[NAMES.index(w.diagnostic)]
    name, way = display_name(d.name, candidates), "higher" if result.winner_direction > 0 else "lower"
    pick = pick_by_study([(c.step, c.diagnostics) for c in candidates], d.name,
                         result.winner_direction)
    text = (f"**{name}** ({d.label}) best predicted the post-RL reward here: Spearman ρ = "
            f"{_num(w.spearman, True)}, 95% bootstrap CI [{_num(w.spearman_ci[0], True)}, "
            f"{_num(w.spearman_ci[1], True)}], Kendall τ = {_num(w.kendall, True)} (n = {w.n}). "
            f"A {way} {name} went with a higher post-RL reward")
    if result.winner_direction != d.good:
        text += ", the opposite of what a user would expect"
    return (f"{text}. {_evidence(w, w.n)} As a criterion: start RL from the candidate with "
            f"the {'highest' if way == 'higher' else 'lowest'} {name} (here step {pick}).")


def _peak_paragraph(result: StudyResult, candidates: list[CandidateResult]) -> str:
    by_step = {c.step: c for c in candidates}
    peak, best = result.peak_score_step, result.best_outcome_step
    if peak is None or best is None:
        return ("No candidate has both an SFT score and a post-RL reward, so the peak-score "
                "checkpoint cannot be compared with the best RL start.")
    p, b = by_step[peak], by_step[best]
    head = (f"The peak-SFT-score checkpoint, step {peak} (sft_score {_num(p.value('sft_score'))}, "
            f"post-RL reward {_num(p.value('final_reward'))}),")
    if result.peak_was_best:
        tied = "" if peak == best else f" (tied with step {best})"
        text = f"{head} was also the best RL start{tied}."
    else:
        text = (f"{head} was not the best RL start: step {best} (sft_score "
                f"{_num(b.value('sft_score'))}) reached post-RL reward "
                f"{_num(b.value('final_reward'))}.")
    inverted, pairs = _inversions(candidates)
    if inverted == 0:
        return (f"{text} No inversion of SFT-score rank vs RL-outcome rank appears: no two "
                "candidates are ordered one way by SFT score and the other way by post-RL "
                "reward.")
    return (f"{text} {inverted} of {pairs} candidate pairs are inverted: the candidate with "
            "the higher SFT score reached the lower post-RL reward.")


def _candidate_table(result: StudyResult, candidates: list[CandidateResult]) -> list[str]:
    names = [d.name for d in DIAGNOSTICS if result.correlation(d.name, "final_reward")]
    head = [display_name(n, candidates) for n in names]
    lines = ["| step | " + " | ".join(head) + " | start reward | final reward | gain | note |",
             "|---" * (len(names) + 5) + "|"]
    for c in sorted(candidates, key=lambda c: c.step):
        note = [label for label, step in (("peak SFT score", result.peak_score_step),
                                          ("best RL outcome", result.best_outcome_step))
                if step == c.step]
        cells = [_num(c.value(n)) for n in [*names, "start_reward", "final_reward", "gain"]]
        lines.append(f"| {c.step} | " + " | ".join(cells) + f" | {', '.join(note)} |")
    return lines


def verdict_markdown(result: StudyResult, candidates: list[CandidateResult]) -> str:
    lines = [f"## Which SFT checkpoint should RL start from? (K = {result.n} candidates)", "",
             "### Rank correlation of each pre-RL diagnostic with the RL outcome", "",
             *_correlation_table(result, candidates), "", "### Verdict", "",
             _winner_paragraph(result, candidates), "", _peak_paragraph(result, candidates),
             "", "### Candidates", "", *_candidate_table(result, candidates)]
    return "\n".join(lines) + "\n"
