"""The tables on stdout: methods at the main size, loads, checkpoint-every-step, sweep."""
from __future__ import annotations

import sys

from rich.console import Console
from rich.table import Table

WIDE = 220  # piped output has no terminal width; keep rows on one line


def seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def times(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}×"


def pair(row: dict, key: str, fmt=seconds) -> str:
    return f"{fmt(row.get(f'{key}_min'))}/{fmt(row.get(f'{key}_median'))}"


def methods_table(result: dict) -> Table:
    table = Table(title=f"Checkpoint saves, {result['settings']['main_size_gb']:g} GB state "
                  f"({result['bounds'].get('bytes', 0) / 1e9:.3g} GB), min/median of "
                  f"{result['settings']['rounds']} interleaved rounds")
    for column in ("method", "stall s", "durable s", "GB", "peak +RSS GB (×state)",
                   "stall ÷ memcpy", "tput ÷ write", "stall ÷ DS", "stall ÷ DCP async",
                   "durable ÷ DS"):
        table.add_column(column, justify="left" if column == "method" else "right",
                         no_wrap=column == "method")
    for row in result["bounds"].get("rows", []):
        table.add_row(row["name"], pair(row, "stall_s"), pair(row, "durable_s"),
                      f"{row['bytes'] / 1e9:.3g}", "", "", "", "", "", "", style="dim")
    for row in result["methods"]:
        table.add_row(
            row["name"], pair(row, "stall_s"), pair(row, "durable_s"), f"{row['bytes'] / 1e9:.3g}",
            f"{row['peak_extra_rss_bytes'] / 1e9:.3g} "
            f"({row.get('peak_extra_rss_over_state', 0):.2f}×)",
            pair(row, "stall_over_memcpy", times), pair(row, "throughput_over_write", times),
            pair(row, "stall_over_deepspeed", times), pair(row, "stall_over_dcp_async", times),
            pair(row, "durable_over_deepspeed", times))
    return table


def in_step_table(result: dict) -> Table | None:
    """The stall of a save inside a training step (forward and backward between the save
    and the update), where it was measured."""
    rows = [r for r in result["bounds"].get("rows", []) + result["methods"]
            if r.get("step_stall_s_min") is not None]
    if not rows:
        return None
    table = Table(title="Stall of a save inside a training step (save, forward+backward, "
                  "wait before the update), min/median")
    for column in ("method", "stall in a step s", "forward+backward s", "÷ memcpy", "÷ DS",
                   "÷ DCP async"):
        table.add_column(column, justify="left" if column == "method" else "right",
                         no_wrap=column == "method")
    for row in rows:
        table.add_row(row["name"], pair(row, "step_stall_s"), pair(row, "step_compute_s"),
                      pair(row, "step_stall_over_memcpy", times),
                      pair(row, "step_stall_over_deepspeed", times),
                      pair(row, "step_stall_over_dcp_async", times))
    return table


def unavailable_lines(result: dict) -> list[str]:
    return [f"unavailable here: {row['name']}: {row['reason']}" for row in result["unavailable"]]


def load_lines(load: dict | None) -> list[str]:
    if not load:
        return ["verified load: not measured (no baton checkpoint was written)"]
    return [f"verified load vs torch.load, {load['files']} files, {load['bytes'] / 1e9:.3g} GB: "
            f"{pair(load, 'verified_load_s')} s vs {pair(load, 'torch_load_s')} s = "
            f"{pair(load, 'verified_over_torch_load', times)} (min / median)"]


def every_step_lines(every: dict) -> list[str]:
    lines = []
    for name, run in every.items():
        if "skipped" in run:
            lines.append(f"checkpoint every step, {name}: skipped ({run['skipped']})")
            continue
        saver = run["save_background_cpu_s_median"]  # None: sync saves, no saver
        saver_cpu = (f"saver {run['saver']} CPU {saver:.3g} s per save, " if saver is not None
                     else "")
        kind = f"{run['mode']}, {run['saver']} saver" if run["mode"] == "async" else run["mode"]
        lines.append(
            f"checkpoint every step, {name} ({kind}, {run['writer']} writer, "
            f"{run['state_bytes'] / 1e9:.3g} GB): {run['throughput_ratio']:.3f}× the throughput "
            f"without saves ({run['steps_per_s_with_saves']:.3g} vs "
            f"{run['steps_per_s_without_saves']:.3g} steps/s; 95% interval over rounds "
            f"{_interval(run['throughput_ratio_ci95'])}; "
            f"stall {run['save_stall_s_median']:.3g} s, {saver_cpu}"
            f"training thread CPU {run['train_thread_cpu_s_per_step_with_saves']:.3g} s per step "
            f"with saves vs {run['train_thread_cpu_s_per_step_without_saves']:.3g} without, "
            f"step {run['step_s_median']:.3g} s); the bound (memcpy + one raw write + fsync "
            f"every step): {run['bound_throughput_ratio']:.3f}× "
            f"({_interval(run['bound_throughput_ratio_ci95'])}); the I/O floor (the write + fsync "
            f"alone, no copy): {run['floor_throughput_ratio']:.3f}× "
            f"({_interval(run['floor_throughput_ratio_ci95'])}); median of {run['blocks']} "
            f"rounds {run['block_ratio_median']:.3f}× (bound {run['bound_block_ratio_median']:.3f}×, "
            f"floor {run['floor_block_ratio_median']:.3f}×); with saves against the bound's "
            f"blocks {run['throughput_ratio_vs_bound']:.3f}× "
            f"({_interval(run['throughput_ratio_vs_bound_ci95'])})")
    return lines


def writer_lines(writers: dict | None) -> list[str]:
    """The native writer's gain over the Python writer, or why there is none to measure."""
    if writers is None:  # a JSON from before the writers were compared
        return []
    if writers["native"] is None:
        return [f"writers: the native writer is not built here ({writers['native_unavailable']}), "
                f"so the Python writer is the default; `make install` builds it"]
    size = f"{writers['bytes'] / 2**20:.0f} MiB"
    return [f"writers ({size}, write + hash + fsync, {writers['rounds']} rounds): the Python "
            f"writer takes {writers['python_over_native_min']:.2f}× (min) / "
            f"{writers['python_over_native_median']:.2f}× (median) the native writer's time; "
            f"the default here: {writers['default']}"]


def sweep_table(sweep: dict) -> Table | None:
    points = sweep["points"]
    if len(points) < 2:
        return None
    table = Table(title="Size sweep: stall/durable, median seconds")
    table.add_column("method")
    for point in points:
        table.add_column(f"{point['state_bytes'] / 1e9:.3g} GB", justify="right")
    names = [r["name"] for r in points[-1]["bounds"].get("rows", []) + points[-1]["methods"]]
    for name in names:
        cells = []
        for point in points:
            rows = {r["name"]: r for r in point["bounds"].get("rows", []) + point["methods"]}
            row = rows.get(name)
            cells.append("-" if row is None else
                         f"{seconds(row['stall_s_median'])}/{seconds(row['durable_s_median'])}")
        table.add_row(name, *cells)
    return table


def print_report(result: dict) -> None:
    console = Console(file=sys.stdout, width=None if sys.stdout.isatty() else WIDE)
    console.print(methods_table(result))
    in_step = in_step_table(result)
    if in_step is not None:
        console.print(in_step)
    lines = (unavailable_lines(result) + load_lines(result["load"])
             + every_step_lines(result["every_step"]) + writer_lines(result.get("writers")))
    for line in lines:
        console.print(line, highlight=False)
    sweep = sweep_table(result["sweep"])
    if sweep is not None:
        console.print(sweep)


def _interval(bounds: list[float]) -> str:
    return f"{bounds[0]:.3f}-{bounds[1]:.3f}×"
