"""`baton study selection [overrides]`: which SFT checkpoint should RL start from, measured.

A short RL from each committed checkpoint of an SFT stage run (same seed, budget and
config), then rank correlations, with bootstrap intervals, between each pre-RL
diagnostic and the RL outcome. See docs/selection_study.md.
"""
from __future__ import annotations


def add_arguments(parser) -> None:
    sub = parser.add_subparsers(dest="kind", required=True, metavar="KIND")
    sub.add_parser("selection", help="RL from each SFT checkpoint; which diagnostic predicts "
                   "the outcome (study.* overrides: stage_run_id, steps, rl_steps, workers)")


def main(args) -> int:
    from core.config import compose

    cfg = compose(list(args.overrides))  # every config error before Prefect starts
    from ckpt import signing

    signing.configure(cfg.ckpt.signing_key_env)
    from flows.stage_config import stage_config
    from flows.study_records import StudyRecording

    stage_config(list(args.overrides), "rl")  # so is the RL stage's
    # No store, no SFT run, too few checkpoints or another stage's: refused before Prefect.
    _, picked = StudyRecording(cfg).candidates()
    print(f"[baton] selection study of {len(picked)} SFT checkpoints (steps "
          f"{[c.step for c in picked]}), {cfg.study.workers} at a time", flush=True)
    from flows.prefect_env import embedded_prefect_env

    embedded_prefect_env(cfg.run.dir)
    from prefect.task_runners import ThreadPoolTaskRunner

    from flows.ephemeral_server import owned_ephemeral_server
    from flows.log_filters import hide_user_error_tracebacks
    from flows.safe_overrides import safe_overrides
    from flows.study import selection_study

    hide_user_error_tracebacks()  # the error's message is printed once, by baton.cli
    study = selection_study.with_options(
        task_runner=ThreadPoolTaskRunner(max_workers=cfg.study.workers))
    with owned_ephemeral_server():
        # Prefect stores the flow's parameters: they must not hold the password.
        result = study(safe_overrides(list(args.overrides), cfg))
    print(result["verdict"])
    print(f"[baton] selection study #{result['id']}: files (verdict.md, study.json, plots) "
          f"under {result['dir']}; winner: {result['winner']}")
    return 0
