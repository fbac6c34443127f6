"""The PNG's every-step panel: the default model's throughput with a save every step, by
saver, beside the bound and the I/O floor, each with its 95% interval over rounds, against
the 3% line. Where the floor's bar ends left of the line, no checkpoint that writes these
bytes durably every step can reach it on that machine."""
from __future__ import annotations

BAR = 0.97
"""Checkpointing every step may cost at most 3% of throughput."""

REFERENCES = (("bound", "bound: memcpy + write + fsync"), ("floor", "I/O floor: write + fsync"))


def every_step_rows(every_step: dict) -> list[tuple[str, float, list[float]]]:
    """(label, throughput ratio, 95% interval) of the default model's blocks; [] when the
    run has none (skipped, or an older JSON)."""
    runs = {key: run for key, run in every_step.items()
            if key.startswith("default_model") and "skipped" not in run}
    if "default_model" not in runs:
        return []
    rows = [(f"saver {run['saver']}", run["throughput_ratio"], run["throughput_ratio_ci95"])
            for run in runs.values()]
    first = runs["default_model"]
    rows += [(label, first[f"{kind}_throughput_ratio"], first[f"{kind}_throughput_ratio_ci95"])
             for kind, label in REFERENCES if f"{kind}_throughput_ratio" in first]
    return rows


def every_step_panel(ax, rows: list[tuple[str, float, list[float]]], blocks: int) -> None:
    places = list(range(len(rows)))
    ratios = [ratio for _, ratio, _ in rows]
    errors = [[ratio - low for _, ratio, (low, _) in rows],
              [high - ratio for _, ratio, (_, high) in rows]]
    colors = ["tab:orange" if label.startswith("saver") else "tab:gray" for label, _, _ in rows]
    ax.barh(places, ratios, xerr=errors, color=colors, capsize=3)
    ax.axvline(BAR, color="tab:red", linestyle="--", label="≤ 3% cost (0.97×)")
    ax.set_yticks(places, [label for label, _, _ in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(min(0.7, min(low for _, _, (low, _) in rows) - 0.02), 1.05)
    ax.set_xlabel("throughput with a save every step ÷ without (95% interval over rounds)")
    ax.set_title(f"checkpoint every step, default model ({blocks} rounds)")
    ax.legend(fontsize=8, loc="lower right")
