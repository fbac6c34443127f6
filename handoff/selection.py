"""Checkpoint selection criteria at a stage boundary.

Pure functions of the candidates' metrics: every candidate gets `eligible`, a
`rejection` reason when it is not chosen, and a `rank`; the chosen one gets a reason
a person can read in lineage and MLflow.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from core.config.validate import CRITERIA
from core.errors import BatonError



class NoEligibleCandidate(BatonError):
    def __init__(self, criterion: str, detail: str):
        self.criterion = criterion
        super().__init__(f"selection.criterion={criterion}: no candidate is eligible ({detail}); "
                         "lower selection.entropy_floor or use criterion=entropy_tolerance")


class NoStudyRecorded(BatonError):
    def __init__(self, where: str):
        super().__init__(f"selection.criterion=study: the lineage store {where} holds no completed "
                         "selection study that named a winning diagnostic; run `baton study "
                         "selection run.dir=...` on an SFT run first (a study whose outcomes "
                         "are all equal names none), or pick another criterion")


@dataclass(frozen=True)
class StudyWinner:
    """What a selection study found (lineage `studies`): the diagnostic that best predicted
    the RL outcome, and its sign (+1: higher was better, -1: lower)."""

    study_id: int
    diagnostic: str
    direction: int
    spearman: float | None = None
    interval: tuple | None = None


@dataclass
class Candidate:
    path: str
    step: int
    metrics: dict
    eligible: bool = True
    rejection: str | None = None
    rank: int = 0
    extra: dict = field(default_factory=dict)


def score_of(metrics: dict, score_metric: str) -> float:
    """`accuracy` -> metrics['accuracy']; `-heldout_loss` -> -metrics['heldout_loss']."""
    sign, key = (-1.0, score_metric[1:]) if score_metric.startswith("-") else (1.0, score_metric)
    if key not in metrics:
        raise BatonError(
            f"selection.score_metric={score_metric!r}: the candidates have no {key!r}; they have "
            f"{', '.join(sorted(metrics))}. On your own data there is no built-in checker, so "
            "accuracy is measured only where your reward functions score RL prompts: set "
            "pipeline.handoffs.<name>.selection.score_metric=-heldout_loss (or entropy)")
    return sign * float(metrics[key])


def select(candidates: list[Candidate], criterion: str, *, score_metric: str,
           entropy_floor: float = 0.0, score_tolerance: float = 0.0,
           study: StudyWinner | None = None) -> tuple[Candidate, str]:
    if criterion not in CRITERIA:
        raise BatonError(f"selection.criterion={criterion!r}: expected one of {', '.join(CRITERIA)}")
    for c in candidates:
        if criterion == "latest" and score_metric.lstrip("-") not in c.metrics:
            continue  # `latest` ignores the score; a diagnostic your data lacks is no error
        c.metrics["score"] = score_of(c.metrics, score_metric)
    if criterion == "study":
        ordered, why = _by_study(candidates, study)
    elif criterion == "latest":
        ordered = sorted(candidates, key=lambda c: -c.step)
        why = lambda best: f"latest committed checkpoint (step {best.step})"  # noqa: E731
    elif criterion == "best_score":
        ordered = sorted(candidates, key=lambda c: (-c.metrics["score"], -c.step))
        why = lambda best: f"highest {score_metric} = {best.metrics['score']:.4f}"  # noqa: E731
    elif criterion == "entropy_floor":
        for c in candidates:
            if c.metrics["entropy"] < entropy_floor:
                c.eligible = False
                c.rejection = (f"entropy {c.metrics['entropy']:.4f} below floor {entropy_floor:.4f}"
                               " (collapsed policy: resists RL exploration)")
        eligible = [c for c in candidates if c.eligible]
        if not eligible:
            raise NoEligibleCandidate(criterion, f"every entropy is below {entropy_floor}")
        ordered = sorted(eligible, key=lambda c: (-c.metrics["score"], -c.step))
        why = lambda best: (f"highest {score_metric} = {best.metrics['score']:.4f} among candidates "  # noqa: E731
                            f"with entropy >= {entropy_floor:.4f} (its entropy {best.metrics['entropy']:.4f})")
    else:
        top = max(c.metrics["score"] for c in candidates)
        for c in candidates:
            if c.metrics["score"] < top - score_tolerance:
                c.eligible = False
                c.rejection = (f"{score_metric} {c.metrics['score']:.4f} more than {score_tolerance} "
                               f"below the best {top:.4f}")
        eligible = [c for c in candidates if c.eligible]
        ordered = sorted(eligible, key=lambda c: (-c.metrics["entropy"], -c.metrics["score"], -c.step))
        why = lambda best: (f"highest entropy {best.metrics['entropy']:.4f} among candidates within "  # noqa: E731
                            f"{score_tolerance} of the best {score_metric} ({top:.4f}); its "
                            f"{score_metric} = {best.metrics['score']:.4f}")
    chosen = ordered[0]
    for rank, c in enumerate(ordered, start=1):
        c.rank = rank
        if c is not chosen and c.rejection is None:
            c.rejection = f"ranked {rank} by {criterion}"
    for c in candidates:
        if not c.eligible:
            c.rank = 0
    return chosen, why(chosen)


def _by_study(candidates: list[Candidate], study: StudyWinner | None):
    """Order by the study's winning diagnostic, in the direction it predicted RL."""
    from handoff.study import diagnostics_from_handoff_metrics

    if study is None:
        raise NoStudyRecorded("in use")
    for c in candidates:
        values = diagnostics_from_handoff_metrics(c.metrics)
        if study.diagnostic not in values:
            raise BatonError(
                f"selection.criterion=study: selection study #{study.study_id} chose "
                f"{study.diagnostic}, which this handoff did not compute for step {c.step} (it "
                f"has {', '.join(sorted(values))}); use the probe settings the study used "
                "(selection.k > 1 for pass@k) or another criterion")
        c.extra["study_value"] = values[study.diagnostic]
    ordered = sorted(candidates, key=lambda c: (-study.direction * c.extra["study_value"], -c.step))
    rho = "" if study.spearman is None else f"Spearman rho {study.spearman:+.2f}"
    if rho and study.interval and None not in study.interval:
        rho += f", 95% CI [{study.interval[0]:+.2f}, {study.interval[1]:+.2f}]"
    word = "highest" if study.direction > 0 else "lowest"

    def why(best: Candidate) -> str:
        return (f"{word} {study.diagnostic} = {best.extra['study_value']:.4f}: the diagnostic that "
                f"best predicted the RL outcome in selection study #{study.study_id}"
                + (f" ({rho})" if rho else ""))
    return ordered, why
