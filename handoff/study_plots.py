"""The study's PNGs: each pre-RL diagnostic against the post-RL reward, and SFT-score rank
against RL-outcome rank (a point off the diagonal is a candidate the SFT score misplaced)."""
from __future__ import annotations

import math
import re
from pathlib import Path

from handoff.study import DIAGNOSTICS, CandidateResult, StudyResult, display_name
from handoff.study_stats import average_ranks

RANK_PLOT = "study_rank_sft_vs_rl.png"


def _file_name(diagnostic: str) -> str:
    return "study_" + re.sub(r"[^A-Za-z0-9_]+", "_", diagnostic.replace("@", "_at_")) + ".png"


def _ci_text(rho: float, ci: tuple[float, float]) -> str:
    if math.isnan(rho):
        return "ρ undefined"
    if math.isnan(ci[0]):
        return f"ρ = {rho:+.2f}, CI undefined"
    return f"ρ = {rho:+.2f} [{ci[0]:+.2f}, {ci[1]:+.2f}]"


def _label_points(ax, xs: list[float], ys: list[float], steps: list[int]) -> None:
    for x, y, step in zip(xs, ys, steps):
        ax.annotate(f"step {step}", (x, y), textcoords="offset points", xytext=(4, 4),
                    fontsize=7)


def _scatter(plt, name: str, result: StudyResult, candidates: list[CandidateResult],
             path: Path) -> None:
    rows = [(c.value(name), c.value("final_reward"), c.step) for c in candidates]
    rows = [r for r in rows if math.isfinite(r[0]) and math.isfinite(r[1])]
    corr = result.correlation(name, "final_reward")
    shown = display_name(name, candidates)
    figure, ax = plt.subplots(figsize=(5.5, 4.5))
    if rows:
        xs, ys, steps = (list(col) for col in zip(*rows))
        ax.scatter(xs, ys, color="tab:blue", zorder=2)
        _label_points(ax, xs, ys, steps)
    ax.set_xlabel(shown)
    ax.set_ylabel("post-RL held-out reward")
    ax.set_title(f"{shown} vs post-RL reward: {_ci_text(corr.spearman, corr.spearman_ci)}"
                 f" (n = {corr.n})", fontsize=9)
    ax.grid(alpha=0.3)
    figure.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(figure)


def _rank_plot(plt, result: StudyResult, candidates: list[CandidateResult], path: Path) -> None:
    rows = [(c.value("sft_score"), c.value("final_reward"), c.step) for c in candidates]
    rows = [r for r in rows if math.isfinite(r[0]) and math.isfinite(r[1])]
    # rank 1 = best on both axes, so agreement is the diagonal
    score_rank = average_ranks([-r[0] for r in rows])
    outcome_rank = average_ranks([-r[1] for r in rows])
    figure, ax = plt.subplots(figsize=(5, 5))
    ax.plot([1, len(rows)], [1, len(rows)], linestyle="--", color="gray", label="same rank")
    ax.scatter(score_rank, outcome_rank, color="tab:red", zorder=2)
    _label_points(ax, score_rank, outcome_rank, [r[2] for r in rows])
    ax.set_xlabel("SFT-score rank (1 = highest)")
    ax.set_ylabel("RL-outcome rank (1 = highest post-RL reward)")
    ax.set_title(f"SFT score vs RL outcome: {result.inversions} inverted pair(s)", fontsize=9)
    ax.invert_xaxis()
    ax.invert_yaxis()
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    figure.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(figure)


def plot_study(result: StudyResult, candidates: list[CandidateResult], out_dir: Path) -> list[Path]:
    """One scatter per diagnostic the study measured, then the rank plot; the paths written."""
    import matplotlib

    matplotlib.use("Agg")  # no display; never pick an interactive backend
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for d in DIAGNOSTICS:
        if result.correlation(d.name, "final_reward") is None:
            continue
        path = out_dir / _file_name(d.name)
        _scatter(plt, d.name, result, candidates, path)
        written.append(path)
    if result.peak_score_step is not None and result.best_outcome_step is not None:
        path = out_dir / RANK_PLOT
        _rank_plot(plt, result, candidates, path)
        written.append(path)
    return written
