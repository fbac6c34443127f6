"""The selective bench's PNG: bytes written per save by both runs (log scale: a save that
references most layers is orders of magnitude smaller), and the relative loss deviation
over the steps after the restart, with the control and the tolerance."""
from __future__ import annotations

from pathlib import Path


def write_selective_plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")  # no display; never pick an interactive backend
    import matplotlib.pyplot as plt

    figure, (bytes_ax, loss_ax) = plt.subplots(1, 2, figsize=(13, 5))
    _bytes(bytes_ax, result)
    _deviation(loss_ax, result)
    s = result["settings"]
    figure.suptitle(f"baton stage sft, {s['steps']} steps, a save every {s['save_every']}; "
                    f"selective threshold {s['threshold']:g}, every {s['full_every']}th save "
                    f"whole ({result['machine']['cpu_model']}, {result['machine']['cores']} cores)",
                    fontsize=10)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _bytes(ax, result: dict) -> None:
    full, selective = result["full"], result["selective"]
    width = 0.4 * result["settings"]["save_every"]
    ax.bar([step - width / 2 for step in full["steps"]], full["bytes_per_save"], width,
           color="tab:gray", label=f"full: {full['total_bytes'] / 1e6:.3g} MB in all")
    ax.bar([step + width / 2 for step in selective["steps"]], selective["bytes_per_save"], width,
           color="tab:blue", label=f"selective: {selective['total_bytes'] / 1e6:.3g} MB in all")
    ax.axvline(result["restart"]["step"], color="tab:red", linestyle=":",
               label=f"restart ({result['restart']['checkpoint']})")
    ax.set_yscale("log")
    ax.set_xlabel("step of the save")
    ax.set_ylabel("bytes written by the save")
    ax.set_title(f"bytes per save: {result['bytes_ratio']:.2f}× fewer selectively")
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=3)


def _deviation(ax, result: dict) -> None:
    restart, control = result["restart"], result["control"]
    ax.plot(restart["steps"], [d * 100 for d in restart["per_step"]], marker="o",
            color="tab:blue", label=f"restart from selective {restart['checkpoint']}")
    ax.plot(control["steps"], [d * 100 for d in control["per_step"]], marker="x",
            color="tab:gray", label=f"control: restart from full {control['checkpoint']}")
    ax.axhline(restart["tolerance"] * 100, color="tab:red", linestyle="--",
               label=f"tolerance {restart['tolerance'] * 100:g}%")
    ax.set_xlabel("step")
    ax.set_ylabel("|loss restarted - loss uninterrupted| / loss (%)")
    ax.set_title(f"loss after the restart: max {restart['deviation_max'] * 100:.3g}%, "
                 f"mean {restart['deviation_mean'] * 100:.3g}%; mean loss "
                 f"{restart['mean_loss_deviation'] * 100:.3g}%")
    ax.xaxis.get_major_locator().set_params(integer=True)  # steps, not fractions of one
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=3)
