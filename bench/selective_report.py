"""The selective bench's tables on stdout: bytes per save, the totals, and the loss after
a restart; then the lines that say how each number was measured, and on what."""
from __future__ import annotations

import sys

from rich.console import Console
from rich.table import Table

from bench.report import WIDE


def size(nbytes: float) -> str:
    return f"{nbytes / 1e6:.3g} MB" if nbytes >= 1e6 else f"{nbytes / 1e3:.3g} kB"


def percent(value: float) -> str:
    return f"{value * 100:.3g}%"


def group(rel: str) -> str:
    """`layers/layers.0.pt` -> `layers.0`."""
    return rel.removeprefix("layers/").removesuffix(".pt")


def referenced(references: dict[str, str]) -> str:
    """Each referenced group with the step of the checkpoint holding it: `norm@5`."""
    return " ".join(f"{group(rel)}@{int(name.removeprefix('step-'))}"
                    for rel, name in references.items()) or "-"


def saves_table(result: dict) -> Table:
    s = result["settings"]
    table = Table(title=f"Bytes written per save: `baton stage sft` (built-in model, "
                  f"parallel=single), {s['steps']} steps, a save every {s['save_every']}; "
                  f"selective: threshold {s['threshold']:g}, every {s['full_every']}th save whole")
    for column in ("step", "full", "selective", "selective ÷ full", "layers written",
                   "layers referenced (@ step saved)"):
        table.add_column(column, justify="left" if column.startswith("layers") else "right")
    by_step = {save["step"]: save for save in result["selective"]["saves"]}
    for save in result["full"]["saves"]:
        chosen = by_step[save["step"]]
        table.add_row(str(save["step"]), size(save["bytes"]), size(chosen["bytes"]),
                      f"{chosen['bytes'] / save['bytes']:.3f}",
                      " ".join(group(rel) for rel in chosen["layers_written"]) or "-",
                      referenced(chosen["references"]))
    return table


def totals_table(result: dict) -> Table:
    table = Table(title="Over the whole stage")
    for column in ("run", "saves", "saves referencing", "bytes written", "per save, mean",
                   "÷ selective", "stage wall s"):
        table.add_column(column, justify="left" if column == "run" else "right")
    for name in ("full", "selective"):
        run = result[name]
        table.add_row(name, str(len(run["saves"])), str(run["composite_saves"]),
                      size(run["total_bytes"]), size(run["total_bytes"] / len(run["saves"])),
                      f"{run['total_bytes'] / result['selective']['total_bytes']:.2f}×",
                      f"{run['stage_s']:.1f}")
    return table


def restart_table(result: dict) -> Table:
    restart, control = result["restart"], result["control"]
    first, last = restart["steps"][0], restart["steps"][-1]
    table = Table(title=f"Training loss after a restart from {restart['checkpoint']}, steps "
                  f"{first}..{last}, against the same run uninterrupted")
    for column in ("step", "loss, selective", "restarted", "deviation", "loss, full",
                   "restarted", "deviation (control)"):
        table.add_column(column, justify="right")
    for index, step in enumerate(restart["steps"]):
        table.add_row(str(step), f"{restart['loss_reference'][index]:.6f}",
                      f"{restart['loss_restart'][index]:.6f}", percent(restart["per_step"][index]),
                      f"{control['loss_reference'][index]:.6f}",
                      f"{control['loss_restart'][index]:.6f}", percent(control["per_step"][index]))
    return table


def summary_lines(result: dict) -> list[str]:
    restart, control, s = result["restart"], result["control"], result["settings"]
    verdict = "within" if restart["within_tolerance"] else "NOT within"
    return [
        f"bytes: full {size(result['full']['total_bytes'])}, selective "
        f"{size(result['selective']['total_bytes'])}: {result['bytes_ratio']:.2f}× fewer bytes "
        "written selectively",
        f"restart from {restart['checkpoint']} "
        + (f"(references {referenced(restart['references'])})" if restart["composite"] else
           f"(no save up to step {s['steps'] // 2} referenced an earlier layer file: a whole "
           "state)")
        + f": deviation over {len(restart['steps'])} steps max {percent(restart['deviation_max'])}, "
        f"mean {percent(restart['deviation_mean'])} ({verdict} {percent(restart['tolerance'])}); "
        f"the window's mean loss deviates {percent(restart['mean_loss_deviation'])}; "
        f"max to step {s['steps']}: {percent(restart['deviation_max_to_end'])}",
        f"control, restart from the full run's {control['checkpoint']}: deviation max "
        f"{control['deviation_max']:.3g} (to step {s['steps']}: {control['deviation_max_to_end']:.3g})",
        "uninterrupted full vs selective run, every step: deviation max "
        f"{result['uninterrupted_deviation_max']:.3g} "
        + ("(saving selectively did not change training)" if result["uninterrupted_deviation_max"]
           == 0 else "(the runs differ before any restart: saving changed training)"),
        "bytes of a save = the sizes in its manifest's `files` (what it wrote), not its "
        "`references` (files an earlier save wrote); deviation = |l_restarted - l| / l per step",
        f"machine: {machine_line(result['machine'])}",
    ]


def machine_line(machine: dict) -> str:
    fs = machine["filesystem"]
    return (f"{machine['cpu_model']}, {machine['cores']} cores, "
            f"{machine['memory_bytes'] / 2**30:.0f} GiB RAM, torch {machine['torch_version']}, "
            f"deepspeed {machine['deepspeed_version']}, run directories on {fs['type']} "
            f"({fs['mount']})")


def print_selective_report(result: dict) -> None:
    console = Console(file=sys.stdout, width=None if sys.stdout.isatty() else WIDE)
    for table in (saves_table(result), totals_table(result), restart_table(result)):
        console.print(table)
    for line in summary_lines(result):
        console.print(line, highlight=False)
