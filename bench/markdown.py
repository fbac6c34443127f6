"""`baton bench ckpt --markdown PATH`: the run's headline numbers as a markdown document,
the machine named, for docs/results/ and the README's checkpoint table."""
from __future__ import annotations

import datetime
import shlex
import sys

from bench.report import every_step_lines, load_lines, writer_lines

HEADLINE = ("baton async (native writer)", "baton async (python writer)", "baton sync",
            "deepspeed default (torch.save)", "dcp async_save (reused stager)",
            "dcp async_save (process, reused shm stager)", "torch.save + fsync")


def machine_line(machine: dict) -> str:
    return (f"{machine['cpu_model']}, {machine['cores']} cores, "
            f"{machine['memory_bytes'] / 2**30:.0f} GiB, {machine['filesystem']['type']}; "
            f"torch {machine['torch_version']}, DeepSpeed {machine['deepspeed_version']}")


def _cell(row: dict, key: str, unit: str = "") -> str:
    low, mid = row.get(f"{key}_min"), row.get(f"{key}_median")
    if low is None or mid is None:
        return "-"
    return f"{low:.3g}{unit} / {mid:.3g}{unit}"


def headline_table(result: dict) -> list[str]:
    rows = {row["name"]: row for row in result["methods"]}
    lines = ["| method | stall in a step, s | ÷ DCP async | time to durable, s | "
             "peak extra memory ÷ state |", "|---|---|---|---|---|"]
    for name in HEADLINE:
        row = rows.get(name)
        if row is None:
            continue
        lines.append(f"| {name} | {_cell(row, 'step_stall_s')} | "
                     f"{_cell(row, 'step_stall_over_dcp_async', '×')} | "
                     f"{_cell(row, 'durable_s')} | {row.get('peak_extra_rss_over_state', 0):.2f}× |")
    return lines


def markdown(result: dict, argv: list[str] | None = None) -> str:
    """The document: what ran, where, the headline table (min / median), the lines."""
    command = "baton " + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
    size = result["settings"]["main_size_gb"]
    lines = [f"# Checkpoint saves, {datetime.date.today().isoformat()}", "",
             f"`{command}` on {machine_line(result['machine'])}.", "",
             f"{size:g} GB state; min / median of {result['settings']['rounds']} interleaved "
             "rounds; the stall is measured inside a training step (forward and backward "
             "between the save and the update).", "",
             *headline_table(result), "",
             *(f"- {line}" for line in load_lines(result["load"]) + writer_lines(result.get("writers"))
               + every_step_lines(result["every_step"]))]
    return "\n".join(lines) + "\n"
