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
    return sign * float(metrics[key])


def select(candidates: list[Candidate], criterion: str, *, score_metric: str,
           entropy_floor: float = 0.0, score_tolerance: float = 0.0) -> tuple[Candidate, str]:
    if criterion not in CRITERIA:
        raise BatonError(f"selection.criterion={criterion!r}: expected one of {', '.join(CRITERIA)}")
    for c in candidates:
        c.metrics["score"] = score_of(c.metrics, score_metric)
    if criterion == "latest":
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
