"""`baton rerun --handoff ID [overrides]`: exit 0 when the stage reproduced bit for bit, 1 if not."""
from __future__ import annotations


def add_arguments(parser) -> None:
    parser.add_argument("--handoff", type=int, required=True, help="recorded handoff id")


def main(args) -> int:
    from baton.config import compose
    from flows.cli import embedded_prefect_env

    cfg = compose(args.overrides)
    embedded_prefect_env(cfg.run.dir)
    from flows.rerun import rerun_stage

    outcome = rerun_stage(args.handoff, list(args.overrides))
    print(f"[baton] {outcome['summary']}")
    return 0 if outcome["reproduced"] else 1
