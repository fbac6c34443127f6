"""Draw docs/architecture.png from the real import graph.

Why a script and not a hand-drawn picture: the picture must not drift from the code.
It asks grimp (the graph library import-linter is built on) for every import between
the modules of the seven layer packages, folds them into package-to-package arrows
weighted by how many module pairs they join, and draws the packages as boxes in layer
order, top to bottom. An arrow that points up (a broken layer) is drawn red.

    .venv/bin/python docs/make_architecture_graph.py [OUT.png]
"""
from __future__ import annotations

import collections
import sys
import textwrap
from pathlib import Path

import grimp
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyBboxPatch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
# top first; bench and flows share one layer in the contract (neither imports the other),
# drawn here as two rows, bench above flows
LAYERS = ("baton", "bench", "flows", "lineage", "handoff", "stages", "ckpt", "core")
ROLE = {
    "baton": "commands: one module per verb",
    "bench": "baton bench ckpt: methods, bounds, runs",
    "flows": "Prefect wiring only",
    "lineage": "store, models, queries, MLflow view",
    "handoff": "selection, diagnostics, carry, reshard, rerun verdict",
    "stages": "objectives, worker loop, launcher, model",
    "ckpt": "pure checkpoint library",
    "core": "errors, config, process identity",
}
BOX_W, BOX_H, STEP = 9.0, 1.3, 2.2  # box size and vertical pitch (data units)
LANE = 0.42  # horizontal gap between side lanes of long arrows


def package_edges(graph) -> tuple[dict, dict]:
    """(importer package, imported package) -> number of module pairs; modules per package."""
    edges: collections.Counter = collections.Counter()
    modules: dict[str, list[str]] = collections.defaultdict(list)
    for module in graph.modules:
        top = module.split(".")[0]
        modules[top].append(module)
        for imported in graph.find_modules_directly_imported_by(module):
            if imported.split(".")[0] != top:
                edges[top, imported.split(".")[0]] += 1
    return edges, modules


def box_y(pkg: str) -> float:
    return -LAYERS.index(pkg) * STEP


def draw_box(ax, pkg: str, modules: list[str]) -> None:
    y = box_y(pkg)
    ax.add_patch(FancyBboxPatch((-BOX_W / 2, y - BOX_H / 2), BOX_W, BOX_H,
                                boxstyle="round,pad=0.05", fc="#eef3fb", ec="#34507a", lw=1.5))
    ax.text(-BOX_W / 2 + 0.2, y + 0.38, f"{pkg}/", fontsize=13, weight="bold", va="center")
    ax.text(-BOX_W / 2 + 1.9, y + 0.38, f"{ROLE[pkg]}  ({len(modules)} modules)",
            fontsize=8.5, va="center", color="#333")
    body = textwrap.fill("  ".join(module_names(modules)), width=100)
    ax.text(-BOX_W / 2 + 0.2, y - 0.15, body, fontsize=7.5, va="center", color="#555",
            family="monospace")


def module_names(modules: list[str]) -> list[str]:
    """The package's modules, one level down; a subpackage as `sub/{a, b}`."""
    groups: dict[str, list[str]] = collections.defaultdict(list)
    for module in modules:
        parts = module.split(".")
        if len(parts) >= 2:
            groups[parts[1]].extend([".".join(parts[2:])] if len(parts) > 2 else [])
    return [f"{name}/{{{', '.join(sorted(subs))}}}" if subs else name
            for name, subs in sorted(groups.items())]


def lanes(edges) -> dict:
    """Give every arrow that skips a layer a side and a lane so that none overlap."""
    long_edges = sorted((e for e in edges if abs(LAYERS.index(e[0]) - LAYERS.index(e[1])) > 1),
                        key=lambda e: abs(LAYERS.index(e[0]) - LAYERS.index(e[1])))
    taken = {-1: [], 1: []}  # side -> [(lo, hi, lane)]
    placed = {}
    for i, (a, b) in enumerate(long_edges):
        lo, hi = sorted((LAYERS.index(a), LAYERS.index(b)))
        best = None
        for side in (-1, 1) if i % 2 == 0 else (1, -1):
            lane = 0
            while any(l == lane and not (hi <= lo2 or lo >= hi2) for lo2, hi2, l in taken[side]):
                lane += 1
            if best is None or lane < best[1]:
                best = (side, lane)
        taken[best[0]].append((lo, hi, best[1]))
        placed[a, b] = best
    return placed


def attach_points(lane_of) -> dict:
    """Where each long arrow meets its two boxes, spread so that no stub crosses a lane.

    Along one side of a box, top to bottom: arrows whose other end is above (inner lanes
    first), then arrows whose other end is below (outer lanes first).
    """
    ends = collections.defaultdict(list)  # (pkg, side) -> [(key, edge)]
    for (a, b), (side, lane) in lane_of.items():
        for pkg, other in ((a, b), (b, a)):
            below = LAYERS.index(other) > LAYERS.index(pkg)
            ends[pkg, side].append(((below, lane if not below else -lane), (a, b)))
    at = {}
    for (pkg, _side), items in ends.items():
        items.sort()
        top, bottom = box_y(pkg) + 0.5, box_y(pkg) - 0.5
        for i, (_, edge) in enumerate(items):
            y = (top + bottom) / 2 if len(items) == 1 else top - i * (top - bottom) / (len(items) - 1)
            at[edge, pkg] = y
    return at


def draw_edge(ax, a: str, b: str, count: int, scale: float, lane_of, where) -> None:
    """One package-to-package arrow; `where` is the gap x (neighbours) or attach points."""
    upward = LAYERS.index(a) > LAYERS.index(b)
    color = "#c0392b" if upward else "#34507a"
    lw = 0.8 + 4.0 * count / scale
    arrow = dict(arrowstyle="-|>,head_width=0.3,head_length=0.6", color=color, lw=lw,
                 shrinkA=0, shrinkB=0)
    if (a, b) not in lane_of:  # neighbouring layers: straight through the gap
        sign = -1 if not upward else 1
        sa, sb = box_y(a) + sign * BOX_H / 2, box_y(b) - sign * BOX_H / 2
        ax.annotate("", xy=(where, sb), xytext=(where, sa), arrowprops=arrow)
        ax.text(where + 0.12, (sa + sb) / 2, str(count), fontsize=9, color=color, va="center")
        return
    side, lane = lane_of[a, b]
    edge_x = side * (BOX_W / 2 + 0.1)
    out_x = side * (BOX_W / 2 + 0.45 + lane * LANE)
    ya, yb = where[(a, b), a], where[(a, b), b]
    ax.plot([edge_x, out_x, out_x], [ya, ya, yb], color=color, lw=lw, solid_capstyle="round")
    ax.annotate("", xy=(edge_x, yb), xytext=(out_x, yb), arrowprops=arrow)
    ax.text(out_x + side * 0.1, (ya + yb) / 2, str(count), fontsize=9, color=color,
            va="center", ha="left" if side > 0 else "right", rotation=90,
            bbox=dict(fc="white", ec="none", pad=0.5))


def main(out: Path) -> None:
    sys.path.insert(0, str(ROOT))
    present = [p for p in LAYERS if (ROOT / p).is_dir()]
    graph = grimp.build_graph(*present, cache_dir=None)
    edges, modules = package_edges(graph)
    lane_of = lanes(edges)
    fig, ax = plt.subplots(figsize=(13, 16))
    for pkg in present:
        draw_box(ax, pkg, modules[pkg])
    scale = max(edges.values())
    short = sorted(e for e in edges if e not in lane_of)
    for a, b in short:
        same_gap = [e for e in short if {*e} == {a, b}]
        slot = -1.0 + 2.0 * same_gap.index((a, b)) if len(same_gap) > 1 else 0.0
        draw_edge(ax, a, b, edges[a, b], scale, lane_of, slot)
    where = attach_points(lane_of)
    for a, b in sorted(lane_of):
        draw_edge(ax, a, b, edges[a, b], scale, lane_of, where)
    width = BOX_W / 2 + 0.8 + LANE * (1 + max([l for _, l in lane_of.values()], default=0))
    ax.set_xlim(-width, width)
    ax.set_ylim(-(len(LAYERS) - 1) * STEP - 1.3, 1.6)
    ax.set_axis_off()
    ax.set_title("baton: package imports (arrow = importer -> imported; number = module pairs)\n"
                 "layers top to bottom; each may import only those below it; red = breaks a layer",
                 fontsize=11)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"wrote {out}: {sum(edges.values())} cross-package imports, "
          f"{sum(len(m) for m in modules.values())} modules")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs" / "architecture.png")
