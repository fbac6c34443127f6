"""Malformed invocations of the real CLI: every one exits 1 or 2 with no traceback.

Most run in-process through `baton.cli.main` (the same parse -> dispatch -> error mapping
as the `baton` script, at a fraction of a process start); a handful run as real
subprocesses. Exit 3 (an internal error) counts as a failure: it means an input reached
code that did not expect it. None of these may start workers, Prefect or a server.
"""
from __future__ import annotations

import pytest

from tests.conftest import run_baton

TRACEBACK = "Traceback"
HUGE = "9" * 30


@pytest.fixture(scope="module")
def paths(tmp_path_factory) -> dict:
    base = tmp_path_factory.mktemp("fuzz")
    a_file = base / "a_file.txt"
    a_file.write_text("not a checkpoint")
    store = base / "with-store"
    assert run_baton("db", "upgrade", f"run.dir={store}").returncode == 0
    return {"run": f"run.dir={base / 'run'}", "store": f"run.dir={store}", "file": str(a_file),
            "missing": str(base / "missing"), "base": base}


def invocations(p: dict) -> list[list[str]]:
    run, store, file, missing = p["run"], p["store"], p["file"], p["missing"]
    return [
        [], ["nosuchcommand"], ["--bogus"], ["stage"], ["stage", "xyz"],
        ["stage", "cpt", "--json", run],
        ["stage", "cpt", "stage.micro_batch=0", run],
        ["stage", "cpt", "stage.max_steps=-5", run],
        ["stage", "cpt", f"parallel.world_size={HUGE}", run],
        ["stage", "cpt", "stage.max_steps=1e99", run],
        ["stage", "cpt", "stage.lr=abc", run],
        ["stage", "cpt", "notanoverride", run],
        ["stage", "cpt", "=5", run],
        ["stage", "cpt", "stage.max_stepz=3", run],
        ["stage", "cpt", "stage.name=sft", run],
        ["stage", "cpt", "parallel.zero_stage=7", run],
        ["stage", "cpt", "stage.max_steps=\u00e9\u00e8\u2603", run],
        ["stage", "cpt", f"model.path={missing}", run],
        ["stage", "cpt", f"model.path={file}", run],
        ["stage", "cpt", "model.path=", run],
        ["stage", "cpt", f"resume={file}", run],
        ["stage", "cpt", "resume=", run],
        ["stage", "sft", "stage.init_from=", run],
        ["stage", "sft", f"stage.init_from={file}", run],
        ["stage", "sft", "stage.init_from=/\u2603/none", run],
        ["ckpt"], ["ckpt", "verify"], ["ckpt", "verify", ""], ["ckpt", "verify", missing],
        ["ckpt", "verify", file], ["ckpt", "verify", missing, "--json"],
        ["ckpt", "inspect", "", "--json"], ["ckpt", "inspect", missing],
        ["ckpt", "diff", "onlyone"], ["ckpt", "diff", missing, missing],
        ["ckpt", "diff", missing, missing, "--atol", "notanumber"],
        ["ckpt", "frobnicate", missing],
        ["rl"], ["rl", "replay"], ["rl", "replay", missing, "--to-step", "3"],
        ["rl", "replay", file, "--to-step", "notanumber"], ["rl", "replay", file, "--to-step", "3"],
        ["rl", "journal"], ["rl", "journal", "show", missing], ["rl", "journal", "show", file],
        ["rl", "journal", "show", missing, "--sample", "1"],
        ["lineage"], ["lineage", "handoff", "notanumber", store],
        ["lineage", "handoff", HUGE, store], ["lineage", "show", "-5", store],
        ["lineage", "show", HUGE, store], ["lineage", "trace", "\u2603", store],
        ["lineage", "show", run],
        ["db", "bogus"], ["db", "current", "store.url=notaurl", run],
        ["db", "current", "store.url=foo://x", run],
        ["rerun"], ["rerun", "--handoff", "notanumber"], ["rerun", "--handoff", "-1", store],
        ["rerun", "--handoff", HUGE, store], ["rerun", "--handoff", "1", run],
        ["run", "--json", run], ["run", "store.url=notaurl", run],
        ["run", "--stages", "", run], ["run", "--stages", "cpt,bogus", run],
        ["run", f"model.path={file}", run],
        ["config", "--json"], ["config", "seed=abc"],
        ["report"], ["report", missing], ["report", str(p["base"])], ["report", file],
        ["report", str(p["base"] / "with-store"), "--pipeline", "notanumber"],
        ["bench", "repro", "--rounds", "1"], ["bench", "repro", "--steps", "abc"],
        ["run", "repro.mode=fast", run], ["stage", "cpt", "repro.isa=avx512", run],
        ["ui", "--port", "-1", run], ["ui", "--port", "abc", run],
        ["study"], ["study", "bogus", run], ["study", "selection", run],
        ["study", "selection", "study.steps=[1]", store], ["study", "selection", "study.workers=0", store],
        ["study", "selection", store], ["study", "selection", "study.stage_run_id=7", store],
        ["lineage", "study", store], ["lineage", "study", "notanumber", store],
        ["lineage", "study", HUGE, store],
        ["run", "selection@pipeline.handoffs.sft_rl.selection=study", run],
        ["run", "selection@pipeline.handoffs.sft_rl.selection=study", store],
        ["stage", "rl", "rl.correction=bogus", run], ["stage", "rl", "rl.correction_cap=0.5", run],
        ["run", "rl.correction_cap=nan", run], ["stage", "rl", "rl.batch_invariant=maybe", run],
        ["stage", "rl", "rl.max_staleness=2", run], ["stage", "rl", "rl.max_staleness=-1", run],
        ["stage", "rl", "rl.env.task=shell", run], ["stage", "rl", "rl.faults.env_crash_rate=0.5", run],
        ["stage", "rl", "rl.env.task=program", "rl.env.timeout_s=1", run],
        ["stage", "cpt", "ckpt.tiers.peer.every=2", run],
        ["stage", "cpt", "ckpt.tiers.peer.every=3", "ckpt.tiers.peer.endpoint=h:1", run],
        ["stage", "cpt", "ckpt.tiers.memory.every=1", "ckpt.tiers.memory.dir=/nonexistent", run],
        ["stage", "cpt", "ckpt.tiers.persistent.url=/no/scheme", run],
        ["stage", "cpt", "parallel.nodes=2", run], ["stage", "cpt", "parallel.nodes=-1", run],
        ["stage", "cpt", "parallel.nodes=2", "parallel.node_rank=5", "parallel.world_size=2",
         "parallel.rdzv_endpoint=h:1", run],
        ["stage", "cpt", "ckpt.selective.threshold=-1", run],
        ["stage", "cpt", "ckpt.snapshot=later", run], ["run", "ckpt.snapshot=", run],
        ["stage", "sft", "parallel=dp2_zero2", "ckpt.selective.threshold=0.1", run],
        ["ckpt", "tiers"], ["ckpt", "tiers", "bogus", run], ["ckpt", "keeper", "--port", "abc"],
        ["ckpt", "keeper", "--port", "70000"], ["ckpt", "keeper", "--max-bytes", "-5"],
        ["bench", "ckpt", "--tiers", "--rounds", "2"],
    ]


@pytest.fixture
def no_jobs(monkeypatch):
    """Fail loudly (exit 3, so the case fails) if a case gets as far as starting a job."""
    import flows.pipeline
    import flows.rerun
    import flows.study
    import baton.commands.ui
    import stages.launch

    def started(*args, **kwargs):
        raise AssertionError("a malformed invocation started a job")

    monkeypatch.setattr(stages.launch, "launch_stage", started)
    monkeypatch.setattr(flows.pipeline, "post_training", started)
    monkeypatch.setattr(flows.rerun, "rerun_stage", started)
    monkeypatch.setattr(flows.study, "selection_study", started)
    monkeypatch.setattr(baton.commands.ui.subprocess, "Popen", started)


def _in_process(argv: list[str], capsys) -> tuple[int, str]:
    from baton.cli import main

    try:
        code = main(list(argv))
    except SystemExit as exc:  # argparse: usage errors exit 2
        code = exc.code
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def test_at_least_thirty_malformed_invocations_exit_nonzero_without_a_traceback(
        paths, no_jobs, capsys, monkeypatch):
    monkeypatch.delenv("BATON_DEBUG", raising=False)
    cases = invocations(paths)
    assert len(cases) >= 30
    bad = []
    for argv in cases:
        code, output = _in_process(argv, capsys)
        refused = code in (1, 2) and output.strip()  # non-zero, and says why
        if not refused or TRACEBACK in output or "internal error" in output:
            bad.append(f"baton {' '.join(argv)!r} -> exit {code}:\n{output[-1500:]}")
    print(f"{len(cases)} malformed invocations, {len(cases) - len(bad)} refused cleanly")
    assert not bad, "\n\n".join(bad)


@pytest.mark.parametrize("argv", [
    [], ["ckpt", "diff", "onlyone"], ["ckpt", "verify", ""], ["lineage", "handoff", "notanumber"],
    ["stage", "cpt", "stage.micro_batch=0", "RUN"], ["rerun", "--handoff", "-1", "RUN"],
    ["run", "store.url=notaurl", "RUN"], ["stage", "cpt", "model.path=/dev/null", "RUN"],
])
def test_malformed_invocations_of_the_baton_process_exit_nonzero_without_a_traceback(
        paths, argv):
    proc = run_baton(*[paths["run"] if arg == "RUN" else arg for arg in argv], timeout=120)
    assert proc.returncode in (1, 2), proc.stdout[-2000:] + proc.stderr[-2000:]
    assert TRACEBACK not in proc.stdout + proc.stderr, proc.stderr[-3000:]
    assert proc.stderr.strip(), "a refusal says why"
    assert not (paths["base"] / "run" / "cpt").exists(), "nothing was launched"
