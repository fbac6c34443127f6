"""`baton lineage show | trace | handoff | study`: browse the lineage store.

Imports of SQLAlchemy and rich happen inside `main`, so `baton --help` stays fast.
"""
from __future__ import annotations

import argparse
import json
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    show = sub.add_parser("show", help="tree of a pipeline run (default: the latest)")
    show.add_argument("pipeline_id", nargs="?", type=int, help="pipeline run id")
    trace = sub.add_parser("trace", help="ancestry of a checkpoint back to the first stage")
    trace.add_argument("checkpoint", help="checkpoint id or directory")
    handoff = sub.add_parser("handoff", help="candidates of a handoff and why one won")
    handoff.add_argument("handoff_id", type=int, help="handoff id")
    study = sub.add_parser("study", help="a selection study: its verdict, correlations and "
                           "candidates (default: the newest)")
    study.add_argument("study_id", nargs="?", type=int, help="study id")
    for cmd in (show, trace, handoff, study):
        cmd.add_argument("--json", action="store_true", help="print records as JSON")


def _console():
    from rich.console import Console
    # Off a terminal (pipes, tests) rich would wrap at 80 columns and cut the tables.
    return Console(width=None if sys.stdout.isatty() else 200, soft_wrap=False)


def _print_json(data) -> None:
    from core.config.secrets import redact_values
    from lineage.records import to_jsonable
    # Configs are stored redacted; masking again covers stores written before that.
    print(json.dumps(redact_values(to_jsonable(data)), indent=2, sort_keys=False))


def show(store, args) -> int:
    from lineage import render
    from lineage.browse import pipeline_view
    view = pipeline_view(store, args.pipeline_id)
    if args.json:
        _print_json({"pipeline_run": view.pipeline, "stage_runs": [
            {**_record(run), "checkpoints": view.checkpoints[run.id]} for run in view.runs],
            "handoffs": view.handoffs})
        return 0
    _console().print(render.pipeline_tree(view.pipeline, view.runs, view.checkpoints,
                                          view.handoffs))
    return 0


def _record(record) -> dict:
    from lineage.records import to_jsonable
    return to_jsonable(record)


def trace(store, args) -> int:
    from lineage import render
    from lineage.browse import find_checkpoint
    checkpoint = find_checkpoint(store, args.checkpoint)
    chain = store.ancestry(checkpoint.id)
    if args.json:
        _print_json(chain)
        return 0
    _console().print(render.ancestry_tree(chain))
    return 0


def handoff(store, args) -> int:
    from lineage import render
    record = store.handoff(args.handoff_id)
    if args.json:
        _print_json(record)
        return 0
    console = _console()
    console.print(render.handoff_header(record))
    console.print(render.candidates_table(record))
    console.print(f"why step {record.chosen_step} won: {record.reason}")
    return 0


def study(store, args) -> int:
    from lineage.errors import UnknownRecord
    if args.study_id is not None:
        record = store.study(args.study_id)
    else:
        record = next(iter(store.studies()), None)
        if record is None:
            raise UnknownRecord("study", "newest", store.url, "run `baton study selection` first")
    if args.json:
        _print_json(record)
        return 0
    print(f"study #{record.id} ({record.kind}) of stage run #{record.from_stage_run_id}: "
          f"{record.status}; MLflow run {record.mlflow_run_id or '-'}")
    print(record.verdict or "no verdict (the study did not complete)")
    return 0


def main(args: argparse.Namespace) -> int:
    from core.config import compose
    from lineage.store import LineageStore
    from lineage.urls import store_url
    cfg = compose(args.overrides)
    with LineageStore.open(store_url(cfg), create=False) as store:
        return {"show": show, "trace": trace, "handoff": handoff,
                "study": study}[args.action](store, args)
