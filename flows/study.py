"""`selection_study`: which SFT checkpoint should RL start from, measured on this task.

prepare (candidates from lineage, refused before any RL compute; the handoff's
diagnostics of each) -> one `study-candidate` subflow per candidate, a short RL from it
in a process of its own, `study.workers` at a time -> analyze (correlations with
bootstrap intervals, plots, verdict; recorded in lineage and MLflow). Wiring only: the
analysis is `handoff.study`, the records `flows.study_records`.
"""
from __future__ import annotations

import time
from pathlib import Path

from prefect import flow, task
from prefect.cache_policies import NO_CACHE
from prefect.futures import wait

from flows.stage_config import stage_config


@task(name="study-prepare", cache_policy=NO_CACHE)
def prepare_study(overrides: list[str]) -> dict:
    from core.repro import pin_this_process
    from flows.study_records import StudyRecording

    from ckpt import signing

    cfg = stage_config(overrides, None)
    pin_this_process(cfg.repro)  # the candidates' diagnostics are computed in this process
    signing.configure(cfg.ckpt.signing_key_env)  # and their checkpoints are read here
    return StudyRecording(cfg).prepare(overrides)


@flow(name="study-candidate", log_prints=True)
def study_candidate(overrides: list[str], study: dict, candidate: dict) -> dict:
    """A short RL from one candidate, in a process of its own; its held-out reward."""
    from flows import study_candidate as one
    from flows.study_records import StudyRecording

    root = Path(study["dir"]) / f"step-{candidate['step']:06d}"
    cfg_overrides = _candidate_overrides(overrides, candidate, study, root)
    t0 = time.monotonic()
    print(f"[study] candidate step {candidate['step']}: RL for {study['rl_steps']} steps in {root}",
          flush=True)
    process = one.start(cfg_overrides, root)
    code = process.wait()
    if code != 0:
        from handoff.study_plan import StudyCandidateFailed

        last = (root / one.LOG).read_text().strip().splitlines()[-1:] or ["(empty)"]
        raise StudyCandidateFailed(candidate["step"], f"exited {code} (last line: {last[0]})",
                                   str(root / one.LOG))
    result = one.outcome(root, candidate["step"])
    StudyRecording(stage_config(overrides, None)).candidate_outcome(study["id"], candidate,
                                                                   result, root)
    print(f"[study] candidate step {candidate['step']}: held-out reward {result['start_reward']:.3f}"
          f" -> {result['final_reward']:.3f} ({time.monotonic() - t0:.0f} s)", flush=True)
    return result


def _candidate_overrides(overrides: list[str], candidate: dict, study: dict, root: Path) -> list[str]:
    """The RL stage exactly as the pipeline would configure it (pipeline.parallel.rl,
    pipeline.overrides.rl), started from this candidate, in its own directory."""
    from flows import study_candidate as one
    from flows.stage_config import stage_overrides

    return stage_overrides(overrides, "rl", str(root),
                           one.rl_overrides(candidate["path"], study["rl_steps"]))


@task(name="study-candidate-rl", cache_policy=NO_CACHE)
def run_candidate(overrides: list[str], study: dict, candidate: dict) -> dict:
    return study_candidate(overrides, study, candidate)


@task(name="study-analyze", cache_policy=NO_CACHE)
def analyze_study(overrides: list[str], study: dict) -> dict:
    from flows.study_records import StudyRecording

    return StudyRecording(stage_config(overrides, None)).analyze(study)


@flow(name="selection_study", log_prints=True)
def selection_study(overrides: list[str] | None = None) -> dict:
    """Run with `.with_options(task_runner=ThreadPoolTaskRunner(study.workers))`: the
    candidates' RL runs are processes, so threads are enough to run them side by side."""
    from core import mkl_preload
    mkl_preload.load_here()  # before a task imports torch: portable mode's square root (core.mkl_preload)
    from flows.study_records import StudyRecording

    overrides = list(overrides or [])
    study = prepare_study(overrides)
    try:
        futures = [run_candidate.submit(overrides, study, c) for c in study["candidates"]]
        wait(futures)
        unfinished = [f for f in futures if not f.state.is_completed()]
        if unfinished:
            unfinished[0].result()  # raises the first failed candidate's error
        return analyze_study(overrides, study)
    except BaseException:
        # A study that stops, for any reason, is recorded as failed, never left running.
        StudyRecording(stage_config(overrides, None)).fail_if_running(study["id"])
        raise
