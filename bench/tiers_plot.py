"""The tier bench's PNG: restore time per tier (fetch + verify and read stacked, medians;
the min as a tick), and the time to place a copy in each tier."""
from __future__ import annotations

from pathlib import Path


def write_tier_plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")  # no display; never pick an interactive backend
    import matplotlib.pyplot as plt

    figure, (restore_ax, copy_ax) = plt.subplots(1, 2, figsize=(14, 5))
    _restore(restore_ax, result["tiers"])
    _copy(copy_ax, result["tiers"])
    figure.suptitle(f"checkpoint {result['checkpoint']}, {result['checkpoint_bytes'] / 1e9:.3g} GB, "
                    f"{result['rounds']} interleaved rounds")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _restore(ax, rows: list[dict]) -> None:
    names = [r["tier"] for r in rows]
    fetch = [r["fetch_verify_s_median"] for r in rows]
    read = [r["read_s_median"] for r in rows]
    ax.barh(names, fetch, color="tab:orange", label="restore(): list, fetch, verify (median)")
    ax.barh(names, read, left=fetch, color="tab:blue", label="read every file (median)")
    ax.scatter([r["restore_s_min"] for r in rows], names, marker="|", s=300, color="black",
               label="whole restore, min", zorder=3)
    ax.invert_yaxis()
    ax.set_xlabel("seconds until the state is in memory")
    ax.set_title("restore from one tier")
    ax.legend(fontsize=8)


def _copy(ax, rows: list[dict]) -> None:
    names = [r["tier"] for r in rows]
    ax.barh(names, [r["copy_s_median"] for r in rows], color="tab:green", label="median")
    ax.scatter([r["copy_s_min"] for r in rows], names, marker="|", s=300, color="black",
               label="min", zorder=3)
    ax.invert_yaxis()
    ax.set_xlabel("seconds")
    ax.set_title("place a copy (ckpt.tiers.replicate)")
    ax.legend(fontsize=8)
