"""`baton bench ckpt --selective` at a tiny size (30 steps, a save every 2, 5 steps
compared after the restart): every save's bytes are measured, every ratio and deviation
derives from numbers in the same JSON, the restart is from a composite checkpoint, the
control restart is exact, the table, plot and MLflow run are written and nothing is left.
The default 200-step bench is run by hand (docs/bench.md)."""
from __future__ import annotations

import json
import math

import pytest

STEPS, SAVE_EVERY, RESTART_STEPS = 30, 2, 5


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    from tests.conftest import run_baton

    tmp = tmp_path_factory.mktemp("bench-selective")
    work = tmp / "work"
    work.mkdir()
    proc = run_baton("bench", "ckpt", "--selective", "--steps", str(STEPS), "--save-every",
                     str(SAVE_EVERY), "--restart-steps", str(RESTART_STEPS),
                     "--json", str(tmp / "sel.json"), "--plot", str(tmp / "sel.png"),
                     "--dir", str(work), env={"MLFLOW_TRACKING_URI": f"sqlite:///{tmp}/mlflow.db"},
                     check=True, timeout=600)
    return proc, json.loads((tmp / "sel.json").read_text()), tmp


def finite(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


@pytest.mark.slow
def test_every_save_of_both_runs_is_measured(bench):
    _, result, _ = bench
    steps = list(range(SAVE_EVERY, STEPS + 1, SAVE_EVERY))
    for name in ("full", "selective"):
        run = result[name]
        assert run["steps"] == steps, name
        assert all(isinstance(b, int) and b > 0 for b in run["bytes_per_save"]), name
        assert run["bytes_per_save"] == [save["bytes"] for save in run["saves"]]
        assert run["total_bytes"] == sum(run["bytes_per_save"])
        assert finite(run["stage_s"]) and run["stage_s"] > 0
    assert result["full"]["composite_saves"] == 0
    assert all(not save["references"] for save in result["full"]["saves"])
    # Something was left to earlier saves, and a save that references writes less.
    selective = result["selective"]
    assert 0 < selective["composite_saves"] < len(steps)
    assert selective["total_bytes"] < result["full"]["total_bytes"]
    machine = result["machine"]
    assert machine["cpu_model"] and machine["cores"] >= 1 and machine["torch_version"]


@pytest.mark.slow
def test_ratio_and_deviations_derive_from_numbers_in_the_same_json(bench):
    _, result, _ = bench
    assert result["bytes_ratio"] == pytest.approx(
        result["full"]["total_bytes"] / result["selective"]["total_bytes"], rel=1e-12)
    for name in ("restart", "control"):
        section = result[name]
        assert section["steps"] == list(range(section["step"] + 1,
                                              section["step"] + RESTART_STEPS + 1))
        expected = [abs(r - ref) / ref for r, ref in zip(section["loss_restart"],
                                                         section["loss_reference"])]
        assert section["per_step"] == pytest.approx(expected, rel=1e-12)
        assert all(finite(v) for v in section["loss_reference"] + section["loss_restart"])
        assert section["deviation_max"] == max(section["per_step"])
        assert section["deviation_mean"] == pytest.approx(sum(expected) / len(expected))
        assert finite(section["deviation_max_to_end"])
        assert section["deviation_max_to_end"] >= section["deviation_max"]
    restart = result["restart"]
    assert restart["within_tolerance"] == (restart["deviation_max"] <= restart["tolerance"])


@pytest.mark.slow
def test_restart_is_from_a_composite_checkpoint_and_the_full_control_is_exact(bench):
    _, result, _ = bench
    restart = result["restart"]
    saves = {save["step"]: save for save in result["selective"]["saves"]}
    assert restart["composite"] and restart["step"] <= STEPS // 2
    assert restart["references"] == saves[restart["step"]]["references"] != {}
    later = [s for s in saves if restart["step"] < s <= STEPS // 2]
    assert all(not saves[s]["references"] for s in later)  # the last composite one by then
    assert result["control"]["step"] == restart["step"]
    assert result["control_deviation_max"] == result["control"]["deviation_max"] == 0.0
    assert result["control"]["deviation_max_to_end"] == 0.0  # a whole checkpoint: bit-exact
    assert result["uninterrupted_deviation_max"] == 0.0  # saving never changes training


@pytest.mark.slow
def test_table_plot_and_mlflow_run_are_written_and_nothing_is_left(bench):
    proc, result, tmp = bench
    assert "Bytes written per save: `baton stage sft`" in proc.stdout
    assert f"Training loss after a restart from {result['restart']['checkpoint']}" in proc.stdout
    assert "stage 4/4: restart from full" in proc.stderr  # one progress line per stage
    assert "[sft] step" not in proc.stdout  # the stages' own output stays out of the table
    png = (tmp / "sel.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 10_000
    assert list((tmp / "work").iterdir()) == []

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp}/mlflow.db")
    [run] = client.search_runs([client.get_experiment_by_name("baton-bench").experiment_id])
    assert run.data.metrics["bytes_ratio"] == result["bytes_ratio"]
    assert run.data.metrics["restart.deviation_max"] == result["restart"]["deviation_max"]
    assert run.data.params["settings.threshold"] == str(result["settings"]["threshold"])
    assert {a.path for a in client.list_artifacts(run.info.run_id)} == {"sel.json", "sel.png"}


@pytest.mark.parametrize("args, message", [
    (["--steps", "30"], "--steps=30: at least 40 with --save-every 5 and --restart-steps 20"),
    (["--threshold", "-1"], "--threshold=-1.0: a relative update >= 0"),
    (["--full-every", "1"], "--full-every=1: at least 2"),
    (["--quick"], "--quick=True: not with --selective"),
    (["stage.max_steps=10"], "stage.max_steps='10': set by the bench itself"),
])
def test_bad_input_is_one_paragraph_and_exit_2_before_any_stage(baton, tmp_path, args, message):
    proc = baton("bench", "ckpt", "--selective", "--dir", str(tmp_path), *args)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert proc.stderr.startswith(f"baton bench: error: {message}")
    assert len(proc.stderr.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == []  # refused before any run directory was made


def test_selective_flags_without_selective_are_refused(baton):
    proc = baton("bench", "ckpt", "--threshold", "0.1")
    assert proc.returncode == 2
    assert proc.stderr.startswith("baton bench: error: --threshold=0.1: only with --selective")
