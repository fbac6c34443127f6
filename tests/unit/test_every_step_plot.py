"""The every-step panel's rows: one per saver, then the bound and the I/O floor, each ratio
with its own interval; none where the run measured no default model."""
from __future__ import annotations

from bench.every_step_plot import every_step_rows


def run(saver: str, ratio: float, floors: float = 0.95) -> dict:
    found = {"saver": saver, "throughput_ratio": ratio, "throughput_ratio_ci95": [ratio - 0.01, ratio + 0.01]}
    for index, kind in enumerate(("bound", "floor")):
        found[f"{kind}_throughput_ratio"] = floors + index / 100
        found[f"{kind}_throughput_ratio_ci95"] = [0.9, 1.0 + index / 100]
    return found


def test_savers_first_then_the_bound_and_the_floor_of_the_shared_blocks():
    """The references come from the thread saver's entry (both entries carry the same
    blocks' in a real run; here they differ, so reading the other entry's would show)."""
    rows = every_step_rows({"default_model": run("thread", 0.78),
                            "default_model_saver_process": run("process", 0.87, floors=0.5),
                            "large_model": run("thread", 1.0)})
    assert [label.split(":")[0] for label, _, _ in rows] == [
        "saver thread", "saver process", "bound", "I/O floor"]
    assert [ratio for _, ratio, _ in rows] == [0.78, 0.87, 0.95, 0.96]
    assert rows[1][2] == [0.86, 0.88] and rows[3][2] == [0.9, 1.01]


def test_no_rows_without_a_measured_default_model():
    assert every_step_rows({"default_model": {"skipped": "--quick"}}) == []
    assert every_step_rows({}) == []
