"""`baton run [overrides]`: the whole pipeline as the Prefect flow `post_training`.

Without PREFECT_API_URL, Prefect starts an ephemeral local API for the run.
"""
from __future__ import annotations

import shlex


def add_arguments(parser) -> None:
    parser.add_argument("--stages", default=None,
                        help="comma-separated subset, e.g. cpt,sft (default: pipeline.stages)")


def main(args) -> int:
    from core.config import compose

    overrides = list(args.overrides)
    if args.stages is not None:  # `--stages ""` is a mistake to report, not "all stages"
        overrides.append(f"pipeline.stages=[{args.stages}]")
    cfg = compose(overrides)  # every config error before Prefect starts
    from stages.preflight import check_stage_inputs
    from stages.run_lock import run_lock

    check_stage_inputs(cfg)  # model.path too: a bad model directory is refused before Prefect
    _check_study_exists(cfg)

    with run_lock(cfg.run.dir):  # one pipeline per run directory, refused before Prefect starts
        return _run(cfg, overrides)


def _check_study_exists(cfg) -> None:
    """criterion=study needs a finished selection study: say so before CPT and SFT run."""
    stages = set(cfg.pipeline.stages)
    if not any(h.selection.criterion == "study" and {h.from_stage, h.to_stage} <= stages
               for h in cfg.pipeline.handoffs.values()):
        return
    from flows.study_records import study_winner
    from handoff.selection import NoStudyRecorded
    from lineage.errors import StoreNotFound
    from lineage.store import LineageStore
    from lineage.urls import store_url

    try:
        with LineageStore.open(store_url(cfg), create=False) as store:
            study_winner(store)
    except StoreNotFound:
        raise NoStudyRecorded(f"for run.dir={cfg.run.dir} (there is none yet)") from None


def _run(cfg, overrides: list[str]) -> int:
    from flows.prefect_env import embedded_prefect_env

    embedded_prefect_env(cfg.run.dir)
    from flows.ephemeral_server import owned_ephemeral_server
    from flows.log_filters import hide_user_error_tracebacks
    from flows.pipeline import post_training
    from flows.safe_overrides import safe_overrides

    hide_user_error_tracebacks()  # the error's message is printed once, by baton.cli

    # Prefect stores the flow's parameters: they must not hold the password.
    with owned_ephemeral_server():
        result = post_training(safe_overrides(overrides, cfg))
    print(f"[baton] pipeline run #{result['pipeline_run_id']} completed; files under {result['root']}")
    for stage, outcome in result["stages"].items():
        last = outcome["checkpoints"][-1] if outcome["checkpoints"] else "none"
        print(f"[baton]   {stage}: {outcome['status']} at step {outcome['step']}; latest checkpoint {last}")
    for line in next_commands(str(cfg.run.dir), result["handoffs"]):
        print(line)
    return 0


def next_commands(run_dir: str, handoffs: dict[str, int]) -> list[str]:
    """What to run next on this very run, to copy as printed."""
    where = f"run.dir={shlex.quote(run_dir)}"
    lines = ["[baton] next:", f"  baton report {shlex.quote(run_dir)}",
             f"  baton lineage show {where}"]
    for name, handoff_id in handoffs.items():
        lines.append(f"  baton rerun --handoff {handoff_id} {where}    # re-run after handoff {name}")
    lines.append(f"  baton ui {where}")
    return lines
