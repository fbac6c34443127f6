"""bench.stage_modes (behind `baton bench repro` and `baton bench batch-invariant`): the
table's ratios are against the first mode, and the plot is written; on a made-up result
(the real runs take minutes)."""
from __future__ import annotations

from bench.batch_invariant import batch_invariant_bench
from bench.repro import repro_bench
from bench.stage_modes import report_lines, write_plot


def _result(bench, times: dict[str, list[float]]) -> dict:
    runs = [{"mode": m, "step_s": t, "round": i + 1} for m, ts in times.items() for i, t in enumerate(ts)]
    summary = {m: {"step_s_min": min(ts), "step_s_median": sorted(ts)[1]} for m, ts in times.items()}
    base = summary[bench.baseline]
    ratios = {m: {k: summary[m][f"step_s_{k}"] / base[f"step_s_{k}"] for k in ("min", "median")}
              for m in times if m != bench.baseline}
    return {"stage": bench.stage, "rounds": 3, "steps": 10, "runs": runs, "summary": summary,
            f"over_{bench.baseline}": ratios}


def test_the_table_gives_ratios_against_the_first_mode_and_the_plot_is_written(tmp_path):
    bench = batch_invariant_bench()
    assert bench.baseline == "fast" and bench.stage == "rl"
    result = _result(bench, {"fast": [0.5, 0.6, 0.55], "batch-invariant": [1.0, 1.5, 1.2]})
    lines = report_lines(bench, result, "test machine")
    assert "| fast | 500.0 ms | 550.0 ms | 1 (the baseline) | 1 (the baseline) |" in lines
    assert "| batch-invariant | 1000.0 ms | 1200.0 ms | 2.00× | 2.18× |" in lines
    write_plot(bench, result, tmp_path / "plot.png")
    assert (tmp_path / "plot.png").stat().st_size > 1000
    repro = repro_bench("cpt")
    assert repro.baseline == "native" and list(repro.modes)[1:] == ["portable-avx2", "portable-baseline"]
