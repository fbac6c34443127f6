"""One candidate of a selection study: a short, fixed-budget RL stage from one SFT checkpoint.

Each candidate runs in a process of its own (`python -m flows.study_candidate ARGS.json`),
so candidates run side by side: an RL stage starts its own Ray instance, which only one
per process can hold. The process dies with the study that started it (stages.lifeline),
and the RL stage's workers and Ray die with it in turn.

The outcome is read from the stage's metrics: the held-out reward (mean over fixed-seed
samples per prompt) at step 0, which is the SFT checkpoint itself, and after the budget.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from ckpt.layout import stage_dir
from core import processes
from stages.lifeline import ENV_CHAIN
from stages.run_files import METRICS

LOG = "study-candidate.log"


def rl_overrides(path: str, rl_steps: int) -> list[str]:
    """The same budget, seed and config for every candidate; only the start differs. One
    evaluation at step 0 and one at the end, one checkpoint at the end."""
    return [f"stage.init_from={path}", f"stage.max_steps={rl_steps}",
            f"stage.save_every={rl_steps}", f"stage.eval_every={rl_steps}",
            "stage.eval_at_start=true", "stage.keep_last=1"]


def start(overrides: list[str], root: Path) -> subprocess.Popen:
    """Start the candidate's process; its output goes to `<root>/study-candidate.log`."""
    root.mkdir(parents=True, exist_ok=True)
    args = root / "study-candidate.json"
    args.write_text(json.dumps({"overrides": overrides}))
    env = {**os.environ, ENV_CHAIN: processes.current().token()}
    with open(root / LOG, "w") as log:
        return subprocess.Popen([sys.executable, "-m", "flows.study_candidate", str(args)],
                                stdout=log, stderr=subprocess.STDOUT, env=env)


def outcome(root: Path, step: int) -> dict:
    """{start_reward, final_reward, gain, final_step} from the RL stage's eval records."""
    from handoff.study_plan import StudyCandidateFailed

    metrics = stage_dir(root, "rl") / METRICS
    evals = {}
    if metrics.is_file():
        for line in metrics.read_text().splitlines():
            record = json.loads(line)
            if "eval_reward" in record:
                evals[record["step"]] = float(record["eval_reward"])
    if not evals or min(evals) != 0 or max(evals) == 0:
        raise StudyCandidateFailed(step, f"left no held-out evaluations at step 0 and at the end "
                                   f"in {metrics} (found steps {sorted(evals)})", str(root / LOG))
    last = max(evals)
    return {"start_reward": evals[0], "final_reward": evals[last],
            "gain": evals[last] - evals[0], "final_step": last}


def main(argv: list[str]) -> int:
    from stages.lifeline import hold

    hold()  # die with the study process, whatever ends it
    from core.config import compose
    from core.repro import pin_this_process

    overrides = json.loads(Path(argv[0]).read_text())["overrides"]
    cfg = compose(overrides)  # flows.stage_config.stage_overrides: stage=rl included
    # This process is the candidate's own: it may pin itself, and does so before anything
    # imports torch (portable mode's square root is loaded then: core.mkl_preload).
    pin_this_process(cfg.repro)
    import contextlib

    from stages.launch import launch_stage
    from stages.prepare import prepare_stage
    with contextlib.ExitStack() as locks:
        model_dir = prepare_stage(cfg, "rl", locks)
        result = launch_stage(cfg, model_dir, {"init_from": cfg.stage.init_from},
                              inputs_checked=True)
    print(f"[study] RL from {cfg.stage.init_from}: {result.status} at step {result.step}",
          flush=True)
    return 0 if result.status == "completed" else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
