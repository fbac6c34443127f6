"""The lineage graph of one pipeline run as a PNG-ready matplotlib figure.

Drawn with matplotlib alone (no graphviz binary on the machines this runs on): one
column per stage depth, one box per stage run listing its checkpoints, one arrow per
handoff labelled with the criterion, the chosen step and the entropy.
"""
from __future__ import annotations

from dataclasses import dataclass

from lineage import records as r

BOX_W, BOX_H, COL_GAP, ROW_GAP = 3.2, 1.6, 1.6, 0.6


@dataclass(frozen=True)
class PipelineView:
    pipeline: r.PipelineRun
    stage_runs: tuple[r.StageRun, ...]
    checkpoints: dict[int, tuple[r.Checkpoint, ...]]
    handoffs: tuple[r.Handoff, ...]


def pipeline_view(store, pipeline_id: int) -> PipelineView:
    runs = tuple(store.stage_runs(pipeline_id))
    return PipelineView(
        pipeline=store.pipeline_run(pipeline_id), stage_runs=runs,
        checkpoints={run.id: tuple(store.checkpoints(run.id)) for run in runs},
        handoffs=tuple(store.handoffs(pipeline_id)))


def stage_depths(view: PipelineView) -> dict[str, int]:
    """Column of each stage: the longest chain of handoffs leading to it."""
    stage_of = {run.id: run.stage for run in view.stage_runs}
    edges = {(stage_of[h.from_stage_run_id], h.to_stage) for h in view.handoffs
             if h.from_stage_run_id in stage_of}
    depth = {run.stage: 0 for run in view.stage_runs}
    for _ in range(len(depth)):  # relax; the stage graph is a small DAG
        for src, dst in edges:
            depth[dst] = max(depth.get(dst, 0), depth.get(src, 0) + 1)
    return depth


def layout(view: PipelineView) -> dict[int, tuple[float, float]]:
    """Lower-left corner of each stage run's box, attempts stacked downwards."""
    depth = stage_depths(view)
    rows: dict[int, int] = {}
    positions = {}
    for run in sorted(view.stage_runs, key=lambda s: (depth[s.stage], s.stage, s.attempt)):
        col = depth[run.stage]
        row = rows.get(col, 0)
        rows[col] = row + 1
        positions[run.id] = (col * (BOX_W + COL_GAP), -row * (BOX_H + ROW_GAP))
    return positions


def _box_text(run: r.StageRun, ckpts: tuple[r.Checkpoint, ...]) -> str:
    steps = ", ".join(str(c.step) for c in ckpts[:6]) + (" …" if len(ckpts) > 6 else "")
    return (f"{run.stage.upper()} #{run.attempt}  (run {run.id})\n{run.status}\n"
            f"checkpoints at steps:\n{steps or '-'}")


def lineage_figure(view: PipelineView):
    from matplotlib.figure import Figure
    from matplotlib.patches import FancyBboxPatch
    pos = layout(view)
    xs = [x for x, _ in pos.values()] or [0.0]
    ys = [y for _, y in pos.values()] or [0.0]
    width = max(xs) + BOX_W - min(xs) + 1.0
    height = max(ys) + BOX_H - min(ys) + 4.0
    fig = Figure(figsize=(max(6.0, width * 1.1), max(3.0, height * 1.1)), dpi=100)
    ax = fig.add_subplot()
    for run in view.stage_runs:
        x, y = pos[run.id]
        ax.add_patch(FancyBboxPatch((x, y), BOX_W, BOX_H, boxstyle="round,pad=0.05",
                                    facecolor="#e8f0fe", edgecolor="#1a73e8"))
        ax.text(x + BOX_W / 2, y + BOX_H / 2, _box_text(run, view.checkpoints.get(run.id, ())),
                ha="center", va="center", fontsize=8)
    low = min(ys) - 0.5
    for h in view.handoffs:
        if h.from_stage_run_id not in pos or h.to_stage_run_id not in pos:
            continue
        (x0, y0), (x1, y1) = pos[h.from_stage_run_id], pos[h.to_stage_run_id]
        start, end = (x0 + BOX_W, y0 + BOX_H / 2), (x1, y1 + BOX_H / 2)
        # An edge that skips a column (SFT -> RL past RM) bends well below the boxes
        # in between so that neither the arrow nor its label crosses them.
        skips = (x1 - x0) > BOX_W + COL_GAP + 0.01
        rad = 0.45 if skips else 0.15
        sag = rad * (end[0] - start[0]) / 4  # how far below the chord the curve's middle lies
        ax.annotate("", xy=end, xytext=start,
                    arrowprops={"arrowstyle": "->", "color": "#d93025", "lw": 1.5,
                                "connectionstyle": f"arc3,rad={rad}"})
        entropy = "n/a" if h.entropy is None else f"{h.entropy:.3f}"
        mid_y = (start[1] + end[1]) / 2 - sag
        label_y = mid_y - 0.45 if skips else mid_y + 0.2
        low = min(low, label_y - 0.3)
        ax.text((start[0] + end[0]) / 2, label_y,
                f"handoff {h.id}: {h.criterion}\nstep {h.chosen_step}, H={entropy}",
                ha="center", fontsize=7, color="#d93025")
    ax.set_xlim(min(xs) - 0.5, max(xs) + BOX_W + 0.5)
    ax.set_ylim(low, max(ys) + BOX_H + 1.0)
    ax.set_title(f"lineage of pipeline run {view.pipeline.id} ({view.pipeline.name})")
    ax.axis("off")
    return fig
