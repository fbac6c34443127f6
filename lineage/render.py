"""Rich renderings of lineage records for `baton lineage show | trace | handoff`."""
from __future__ import annotations

import json

from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from lineage import records as r


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _entropy(value) -> str:
    return "n/a" if value is None else f"{value:.4f}"


def _metric(value) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def handoff_line(h: r.Handoff) -> Text:
    return Text.assemble(
        ("← handoff ", "bold red"), (str(h.id), "bold red"),
        f" from {h.from_stage.upper()} (stage run {h.from_stage_run_id}): criterion ",
        (h.criterion, "bold"), f", chosen step {h.chosen_step} (checkpoint "
        f"{h.chosen_checkpoint_id}), entropy {_entropy(h.entropy)}")


def checkpoint_line(c: r.Checkpoint) -> Text:
    state = "" if c.committed else "  [uncommitted]"
    digest = f"  {c.content_digest[:16]}…" if c.content_digest else ""
    return Text(f"checkpoint {c.id}  step {c.step}  {c.format}  {_size(c.bytes)}  "
                f"tokens {c.tokens_seen}  {c.path}{digest}{state}")


def stage_run_label(s: r.StageRun) -> Text:
    parallel = " ".join(f"{k}={v}" for k, v in sorted(s.parallel_config.items()))
    resumed = (f"  resumed from checkpoint {s.resumed_from_checkpoint_id}"
               if s.resumed_from_checkpoint_id else "")
    env = s.environment or {}
    kernels = (f"  {env.get('repro_mode')} kernels ({env.get('cpu_capability')}, "
               f"{(env.get('cpu') or {}).get('model')})" if env else "")
    return Text.assemble((f"{s.stage.upper()} attempt {s.attempt}", "bold cyan"),
                         f" (stage run {s.id})  {s.status}  {parallel}{resumed}{kernels}")


def dataset_line(d: dict) -> Text:
    """One dataset a stage run read: which, what content, how much of it."""
    read = f"  read {d['rows_read']} rows" if d.get("rows_read") is not None else ""
    keys = " ".join(f"{role}={column}" for role, column in (d.get("keys") or {}).items()
                    if role != column)
    changed = "  [resumed on changed data: data.allow_changed]" if d.get("allowed_change") else ""
    return Text(f"{d['role']} data {d['path']}  {d['format']}  {d['rows']} rows  "
                f"{str(d.get('digest'))[:19]}…{read}{'  keys ' + keys if keys else ''}{changed}")


def add_datasets(node, run: r.StageRun) -> None:
    for dataset in run.datasets or ():
        node.add(dataset_line(dataset))


def pipeline_tree(p: r.PipelineRun, runs, checkpoints: dict, handoffs) -> Tree:
    tree = Tree(Text.assemble((f"pipeline run {p.id}", "bold"), f" {p.name!r}  {p.status}  "
                              f"config {p.config_hash[:12]}  seed {p.seed}  code {p.code_version}"
                              f"  started {p.started_at:%Y-%m-%d %H:%M:%S}"))
    for run in runs:
        node = tree.add(stage_run_label(run))
        add_datasets(node, run)
        for h in handoffs:
            if h.to_stage_run_id == run.id:
                node.add(handoff_line(h))
        for c in checkpoints.get(run.id, ()):
            node.add(checkpoint_line(c))
    pending = [h for h in handoffs if h.to_stage_run_id is None]
    for h in pending:
        tree.add(Text.assemble(handoff_line(h), f"  → {h.to_stage.upper()} (not started)"))
    return tree


def ancestry_tree(chain: list[r.AncestryLink]) -> Tree:
    head = chain[0].checkpoint
    tree = Tree(Text.assemble(("checkpoint ", "bold"), (str(head.id), "bold"),
                              f"  {head.stage.upper()} step {head.step}  {head.path}"))
    node = tree
    for link in chain:
        label = Text.assemble(stage_run_label(link.stage_run), f"  saved step {link.checkpoint.step}"
                              f" (checkpoint {link.checkpoint.id}, via {link.via})")
        node = node.add(label)
        add_datasets(node, link.stage_run)
        for side in link.side_inputs:
            node.add(Text.assemble("also ", handoff_line(side)))
        if link.handoff is not None:
            node = node.add(handoff_line(link.handoff))
        elif link.stage_run.resumed_from_checkpoint_id:
            node = node.add(Text(f"resumed from checkpoint {link.stage_run.resumed_from_checkpoint_id}"))
        else:
            node.add(Text("first stage: no handoff", style="dim"))
    return tree


def handoff_header(h: r.Handoff) -> Text:
    to = f"stage run {h.to_stage_run_id}" if h.to_stage_run_id else "not started"
    lines = [
        f"handoff {h.id}: {h.from_stage.upper()} (stage run {h.from_stage_run_id}) → "
        f"{h.to_stage.upper()} ({to})",
        f"criterion: {h.criterion} {json.dumps(h.criterion_params, sort_keys=True)}",
        f"chosen: checkpoint {h.chosen_checkpoint_id} at step {h.chosen_step}, "
        f"entropy {_entropy(h.entropy)}",
        f"carry policy: {json.dumps(h.carry_policy, sort_keys=True)}",
    ]
    if h.reshard:
        lines.append(f"reshard: {json.dumps(h.reshard, sort_keys=True)}")
    if h.equivalence:
        lines.append(f"equivalence: {json.dumps(h.equivalence, sort_keys=True)}")
    return Text("\n".join(lines))


def candidates_table(h: r.Handoff) -> Table:
    metric_names = sorted({k for c in h.candidates for k in c.metrics})
    table = Table(title=f"candidates of handoff {h.id}")
    for column in ("", "rank", "checkpoint", "step", "eligible", *metric_names, "rejected because"):
        table.add_column(column)
    for c in h.candidates:
        table.add_row("★ chosen" if c.chosen else "", "-" if c.rank is None else str(c.rank),
                      str(c.checkpoint_id), str(c.step), "yes" if c.eligible else "no",
                      *[_metric(c.metrics[k]) if k in c.metrics else "" for k in metric_names],
                      c.rejection_reason or "", style="bold green" if c.chosen else None)
    return table
