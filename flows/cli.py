"""`baton run [overrides]`: the main job on the embedded defaults."""
from __future__ import annotations


def add_arguments(parser) -> None:
    parser.add_argument("--stages", default="cpt,sft",
                        help="comma-separated stages to run in order (default: cpt,sft)")


def main(args) -> int:
    from flows.sequence import run_sequence

    return run_sequence(args.overrides, args.stages.split(","))
