"""The PNG: stall and time-until-durable per method (log scale, bounds as lines), how
each grows with the state size, and the default model's every-step throughput."""
from __future__ import annotations

from pathlib import Path

from bench.every_step_plot import every_step_panel, every_step_rows


def write_plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")  # no display; never pick an interactive backend
    import matplotlib.pyplot as plt

    sweep = result["sweep"]["points"]
    every_step = every_step_rows(result.get("every_step", {}))
    columns = 1 + (len(sweep) > 1) + bool(every_step)
    figure, axes = plt.subplots(1, columns, figsize=(9 * columns, 7), squeeze=False)
    panels = iter(axes[0])
    _per_method(next(panels), result)
    if len(sweep) > 1:
        _sweep(next(panels), sweep, plt)
    if every_step:
        blocks = result["every_step"]["default_model"]["blocks"]
        every_step_panel(next(panels), every_step, blocks)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _per_method(ax, result: dict) -> None:
    rows = result["methods"]
    names = [r["name"] for r in rows]
    places = range(len(rows))
    ax.barh([p + 0.27 for p in places], [r["stall_s_median"] for r in rows], height=0.27,
            label="stall, nothing to hide it (median)", color="tab:red")
    ax.barh(list(places), [r.get("step_stall_s_median", 0) for r in rows], height=0.27,
            label="stall inside a training step (median)", color="tab:orange")
    ax.barh([p - 0.27 for p in places], [r["durable_s_median"] for r in rows], height=0.27,
            label="until durable (median)", color="tab:blue")
    bounds = result["bounds"]
    if "memcpy_s_median" in bounds:
        ax.axvline(bounds["memcpy_s_median"], color="tab:red", linestyle="--",
                   label="memcpy bound")
    if "write_s_median" in bounds:
        ax.axvline(bounds["write_s_median"], color="tab:blue", linestyle="--",
                   label="write + fsync bound")
    ax.set_yticks(list(places), names, fontsize=8)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("seconds (log)")
    ax.set_title(f"{result['bounds'].get('bytes', 0) / 1e9:.3g} GB state")
    ax.legend(fontsize=8)


def _sweep(ax, points: list[dict], plt) -> None:
    sizes = [p["state_bytes"] / 1e9 for p in points]
    names = [r["name"] for r in points[-1]["methods"]]
    palette = plt.get_cmap("tab20")
    for index, name in enumerate(names):
        color = palette(index % 20)
        for key, style in (("stall_s_median", "-"), ("durable_s_median", ":")):
            values = [next((r[key] for r in p["methods"] if r["name"] == name), None)
                      for p in points]
            pairs = [(s, v) for s, v in zip(sizes, values) if v is not None]
            label = name if key == "stall_s_median" else None
            ax.plot(*zip(*pairs), style, marker="o", markersize=3, color=color, label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("state size, GB (log)")
    ax.set_ylabel("seconds (log): stall solid, until durable dotted")
    ax.set_title("size sweep (median)")
    ax.legend(fontsize=6)
