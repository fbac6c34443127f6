"""N steps straight vs. k steps, stop, resume to N: identical state and loss trace.

Every combination runs real DeepSpeed worker processes (torchrun, gloo on CPU).
"""
from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.conftest import metrics, run_baton

N, K = 4, 2
LAYOUTS = [(ws, z) for ws in (1, 2) for z in (0, 1, 2, 3)]


def _train(run_dir, stage, ws, zero, *extra):
    return run_baton("stage", stage, f"run.dir={run_dir}", f"stage.max_steps={N}",
                     f"stage.save_every={K}", f"parallel.world_size={ws}",
                     f"parallel.zero_stage={zero}", "stage.eval_every=2", *extra, check=True)


CASES = [(stage, ws, zero) for stage in ("cpt", "sft") for ws, zero in LAYOUTS]


def _straight_then_resumed(root, stage, ws, zero):
    straight, resumed = root / "straight", root / "resumed"
    _train(straight, stage, ws, zero)
    step_k = straight / stage / "checkpoints" / f"step-{K:06d}"
    _train(resumed, stage, ws, zero, f"resume={step_k}")
    return straight, resumed


@pytest.fixture(scope="module")
def matrix(tmp_path_factory):
    """Every case's straight and resumed runs, two cases at a time: most of a run is
    process start-up and imports, and two overlap well on two cores. The cases are
    independent (own run directories, torchrun on free ports)."""
    root = tmp_path_factory.mktemp("resume-matrix")
    # Each test waits for its own case only: waiting for all sixteen here would make the
    # first test's setup as long as the whole matrix, past pytest's per-test timeout.
    pool = ThreadPoolExecutor(2)
    yield {case: pool.submit(_straight_then_resumed, root / "-".join(map(str, case)), *case)
           for case in CASES}
    pool.shutdown(wait=True, cancel_futures=True)


@pytest.mark.slow
@pytest.mark.parametrize("stage", ["cpt", "sft"])
@pytest.mark.parametrize("ws,zero", LAYOUTS, ids=[f"ws{w}-zero{z}" for w, z in LAYOUTS])
def test_resume_from_step_k_reproduces_the_straight_run_bit_for_bit(matrix, stage, ws, zero):
    from ckpt.diff import diff_checkpoints

    straight, resumed = matrix[(stage, ws, zero)].result()  # a failed run raises here, named
    final = f"{stage}/checkpoints/step-{N:06d}"
    # `baton ckpt diff`'s own comparison, in this process: the command line is tested
    # elsewhere, and sixteen more process start-ups would test nothing more.
    report = diff_checkpoints(straight / final, resumed / final)
    assert report.identical, [f for f in report.files if not f.identical] or report
    a, b = metrics(straight, stage), metrics(resumed, stage)
    assert sorted(b) == list(range(K + 1, N + 1))
    # Each checkpoint carries its step's metrics (what stage.keep_best ranks).
    assert json.loads((resumed / final / "meta.json").read_text())["metrics"]["loss"] == a[N]["loss"]
    for step in b:
        assert a[step]["loss"] == b[step]["loss"], f"loss differs at step {step}"
        assert a[step]["lr"] == b[step]["lr"]
        assert a[step].get("eval_loss") == b[step].get("eval_loss")


@pytest.mark.slow
@pytest.mark.parametrize("zero", [0, 2])
def test_resume_from_a_sigterm_taken_mid_accumulation_is_bit_exact(tmp_path, zero):
    # micro_batch 2 x 2 ranks x 4 accumulation steps = global batch 16; SIGTERM after
    # global micro-step 6 lands 2 micro-steps into optimizer step 2.
    layout = ["stage.micro_batch=2", "stage.global_batch=16"]
    straight, preempted = tmp_path / "straight", tmp_path / "preempted"
    _train(straight, "cpt", 2, zero, *layout)
    _train(preempted, "cpt", 2, zero, *layout, "debug.preempt_at_micro_step=6")
    result = (preempted / "cpt" / "result.json").read_text()
    assert '"status": "preempted"' in result
    mid = preempted / "cpt" / "checkpoints" / "step-000001-micro-02"
    inspect = run_baton("ckpt", "inspect", str(mid), "--json", check=True)
    assert '"mid_accumulation": true' in inspect.stdout
    assert "grad_accum" in inspect.stdout
    assert run_baton("ckpt", "verify", str(mid)).returncode == 0

    _train(preempted, "cpt", 2, zero, *layout, "resume=latest")
    final = f"cpt/checkpoints/step-{N:06d}"
    diff = run_baton("ckpt", "diff", str(straight / final), str(preempted / final))
    assert diff.returncode == 0, diff.stdout
    a, b = metrics(straight, "cpt"), metrics(preempted, "cpt")
    assert [a[s]["loss"] for s in range(1, N + 1)] == [b[s]["loss"] for s in range(1, N + 1)]


@pytest.mark.slow
def test_synchronous_saves_resume_bit_exact_and_match_asynchronous_ones(tmp_path):
    """ckpt.mode=sync stays available: the same run saved synchronously resumes bit for bit,
    and its checkpoint holds the same state as the asynchronous (default) run's."""
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    asynchronous = tmp_path / "async"
    _train(straight, "cpt", 2, 2, "ckpt.mode=sync")
    _train(resumed, "cpt", 2, 2, "ckpt.mode=sync",
           f"resume={straight / 'cpt' / 'checkpoints' / f'step-{K:06d}'}")
    _train(asynchronous, "cpt", 2, 2)
    final = f"cpt/checkpoints/step-{N:06d}"
    for other in (resumed, asynchronous):
        diff = run_baton("ckpt", "diff", str(straight / final), str(other / final))
        assert diff.returncode == 0 and "IDENTICAL" in diff.stdout, diff.stdout + diff.stderr


@pytest.mark.slow
def test_saves_by_the_saver_process_resume_bit_exact_and_match_the_saver_threads(tmp_path):
    """ckpt.saver=process, two ranks: their saver processes agree on each commit over a
    group of their own. The run resumes bit for bit from the saver process's checkpoint,
    and its final checkpoint holds the same state as the saver thread's (the default)."""
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    threaded = tmp_path / "thread"
    _train(straight, "cpt", 2, 2, "ckpt.saver=process")
    _train(resumed, "cpt", 2, 2, "ckpt.saver=process",
           f"resume={straight / 'cpt' / 'checkpoints' / f'step-{K:06d}'}")
    _train(threaded, "cpt", 2, 2)
    final = f"cpt/checkpoints/step-{N:06d}"
    for other in (resumed, threaded):
        diff = run_baton("ckpt", "diff", str(straight / final), str(other / final))
        assert diff.returncode == 0 and "IDENTICAL" in diff.stdout, diff.stdout + diff.stderr
    a, b = metrics(straight, "cpt"), metrics(resumed, "cpt")
    assert [a[s]["loss"] for s in range(K + 1, N + 1)] == [b[s]["loss"] for s in range(K + 1, N + 1)]
