"""`baton rerun --handoff ID [overrides]`: exit 0 when the stage reproduced bit for bit, 1 if not."""
from __future__ import annotations


def add_arguments(parser) -> None:
    parser.add_argument("--handoff", type=int, required=True, help="recorded handoff id")


def main(args) -> int:
    from core.config import compose
    from flows.prefect_env import embedded_prefect_env

    cfg = compose(args.overrides)
    from lineage.store import LineageStore
    from lineage.urls import store_url

    with LineageStore.open(store_url(cfg), create=False) as store:
        store.handoff(args.handoff)  # an unknown id (or no store) is refused before Prefect starts
    embedded_prefect_env(cfg.run.dir)
    from flows.log_filters import hide_user_error_tracebacks
    from flows.rerun import rerun_stage
    from flows.safe_overrides import safe_overrides

    hide_user_error_tracebacks()  # the error's message is printed once, by baton.cli

    # Prefect stores the flow's parameters: they must not hold the password.
    outcome = rerun_stage(args.handoff, safe_overrides(list(args.overrides), cfg))
    print(f"[baton] {outcome['summary']}")
    return 0 if outcome["reproduced"] else 1
