"""`baton bench ckpt` at a tiny size: every number is measured, every ratio is the ratio
of numbers in the same JSON, the plot is written, nothing is left behind. The full bench
(GB-sized states) is run by hand, never here (docs/bench.md)."""
from __future__ import annotations

import json
import math
import statistics

import pytest

# Every method the bench knows; each must be measured or listed as unavailable with a reason.
METHODS = (
    "baton sync", "baton async (python writer)", "baton async (native writer)",
    "deepspeed default (torch.save)", "deepspeed fastpersist (aio writer)",
    "deepspeed fastpersist (python writer)", "deepspeed decoupled (aio writer)",
    "deepspeed decoupled (python writer)", "torch.save + fsync", "dcp save",
    "dcp async_save (default stager)", "dcp async_save (reused stager)",
    "dcp async_save (process, reused shm stager)",
)
# These run on any CPU machine; the native writer runs wherever it was built.
MUST_RUN = ("baton sync", "baton async (python writer)", "deepspeed default (torch.save)",
            "torch.save + fsync", "dcp save", "dcp async_save (default stager)",
            "dcp async_save (reused stager)")
ANCHORS = {"deepspeed": "deepspeed default (torch.save)",
           "dcp_async": "dcp async_save (reused stager)"}


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    from tests.conftest import run_baton

    tmp = tmp_path_factory.mktemp("bench")
    work = tmp / "work"
    work.mkdir()
    proc = run_baton("bench", "ckpt", "--size-gb", "0.004", "--rounds", "3", "--quick",
                     "--every-step-blocks", "4",  # one more than --quick's, to see it taken
                     "--json", str(tmp / "bench.json"), "--plot", str(tmp / "bench.png"),
                     "--markdown", str(tmp / "bench.md"),
                     "--dir", str(work), env={"MLFLOW_TRACKING_URI": f"sqlite:///{tmp}/mlflow.db"},
                     check=True, timeout=300)
    return proc, json.loads((tmp / "bench.json").read_text()), tmp


def positive(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


@pytest.mark.slow
def test_every_method_is_measured_or_says_why_not(bench):
    _, result, _ = bench
    measured = {m["name"] for m in result["methods"]}
    reasons = {u["name"]: u["reason"] for u in result["unavailable"]}
    assert set(METHODS) == measured | set(reasons), (measured, reasons)
    assert not measured & set(reasons)
    assert all(reason.strip() and "\n" not in reason for reason in reasons.values())
    for name in MUST_RUN:
        assert name in measured, reasons.get(name)
    if "baton async (native writer)" in reasons:
        assert reasons["baton async (native writer)"].startswith("native writer not built")


@pytest.mark.slow
def test_every_number_is_measured(bench):
    _, result, _ = bench
    bounds = result["bounds"]
    for key in ("memcpy_s", "memcpy_s_median", "write_s", "write_s_median", "bytes"):
        assert positive(bounds[key]), key
    for row in result["methods"]:
        for key in ("stall_s_min", "stall_s_median", "durable_s_min", "durable_s_median", "bytes"):
            assert positive(row[key]), (row["name"], key)
        assert row["rounds"] == 3
        for key in ("step_stall_s_min", "step_stall_s_median", "step_compute_s_min",
                    "step_compute_s_median"):  # the same rounds with a training step around
            assert positive(row[key]), (row["name"], key)
        assert row["stall_s_min"] <= row["stall_s_median"]
        assert row["durable_s_min"] >= row["stall_s_min"]  # durable is timed from the same start
        assert row["durable_s_median"] >= row["stall_s_median"]
        assert row["peak_extra_rss_bytes"] >= 0
        assert row["peak_extra_rss_bytes"] == (row["resident_extra_rss_bytes"]
                                               + row["save_extra_rss_bytes"])
    machine = result["machine"]
    assert machine["cpu_model"] and machine["cores"] >= 1
    assert machine["torch_version"] and machine["deepspeed_version"]


@pytest.mark.slow
def test_every_ratio_is_the_ratio_of_measured_numbers(bench):
    _, result, _ = bench
    bounds = result["bounds"]
    rows = {row["name"]: row for row in result["methods"]}
    state = bounds["bytes"]
    for row in rows.values():
        expected = {"peak_extra_rss_over_state": row["peak_extra_rss_bytes"] / state}
        for stat, memcpy, write in (("min", "memcpy_s", "write_s"),
                                    ("median", "memcpy_s_median", "write_s_median")):
            stall, durable = row[f"stall_s_{stat}"], row[f"durable_s_{stat}"]
            expected[f"stall_over_memcpy_{stat}"] = stall / bounds[memcpy]
            expected[f"durable_over_write_{stat}"] = durable / bounds[write]
            expected[f"throughput_over_write_{stat}"] = (
                (row["bytes"] / durable) / (bounds["write_bytes"] / bounds[write]))
            for key, anchor in ANCHORS.items():
                expected[f"stall_over_{key}_{stat}"] = stall / rows[anchor][f"stall_s_{stat}"]
                expected[f"durable_over_{key}_{stat}"] = durable / rows[anchor][f"durable_s_{stat}"]
            in_step = row[f"step_stall_s_{stat}"]
            expected[f"step_stall_over_memcpy_{stat}"] = in_step / bounds[memcpy]
            for key, anchor in ANCHORS.items():
                expected[f"step_stall_over_{key}_{stat}"] = (
                    in_step / rows[anchor][f"step_stall_s_{stat}"])
        ratios = {k: v for k, v in row.items() if "_over_" in k}
        assert ratios == pytest.approx(expected, rel=1e-12), row["name"]
    assert bounds["write_s"] == min(bounds["write_python_s"], bounds["write_dd_s"])


@pytest.mark.slow
def test_loads_and_checkpoint_every_step_are_measured(bench):
    _, result, _ = bench
    load = result["load"]
    for stat in ("min", "median"):
        assert positive(load[f"torch_load_s_{stat}"]) and positive(load[f"verified_load_s_{stat}"])
        assert load[f"verified_over_torch_load_{stat}"] == pytest.approx(
            load[f"verified_load_s_{stat}"] / load[f"torch_load_s_{stat}"], rel=1e-12)
    assert load["files"] >= 1 and positive(load["bytes"])
    runs = [result["every_step"]["default_model"], result["every_step"]["default_model_saver_process"]]
    assert [run["saver"] for run in runs] == ["thread", "process"]
    assert runs[0]["steps_per_s_without_saves"] == runs[1]["steps_per_s_without_saves"]
    for kind in ("bound", "floor"):  # the same blocks, once for both savers
        assert runs[0][f"{kind}_block_ratios"] == runs[1][f"{kind}_block_ratios"]
    for run in runs:  # shared blocks without saves and with the bound; its own with saves
        _every_step_is_measured(run)
        assert run["blocks"] == 4 == result["settings"]["every_step_blocks"]
    assert result["every_step"]["large_model"] == {"skipped": "--quick"}
    [point] = result["sweep"]["points"]
    assert point["methods"] == result["methods"] and point["bounds"] == result["bounds"]


@pytest.mark.slow
def test_the_printed_every_step_lines_say_what_the_json_says(bench):
    """bench.report.every_step_lines: one line per run, its ratios as measured; the skipped
    large model says why."""
    from bench.report import every_step_lines

    proc, result, _ = bench
    lines = {line.split(" (", 1)[0].split(": ", 1)[0]: line
             for line in every_step_lines(result["every_step"])}
    assert set(lines) == {f"checkpoint every step, {name}" for name in result["every_step"]}
    assert lines["checkpoint every step, large_model"].endswith("skipped (--quick)")
    for name in ("default_model", "default_model_saver_process"):
        run, line = result["every_step"][name], lines[f"checkpoint every step, {name}"]
        assert f"({run['mode']}, {run['saver']} saver, " in line
        assert f": {run['throughput_ratio']:.3f}× the throughput without saves" in line
        assert f"the bound (memcpy + one raw write + fsync every step): " \
               f"{run['bound_throughput_ratio']:.3f}×" in line
        assert f"the I/O floor (the write + fsync alone, no copy): " \
               f"{run['floor_throughput_ratio']:.3f}×" in line
        assert line[:80] in proc.stdout  # printed (rich wraps the rest of a long line)


def _every_step_is_measured(run: dict) -> None:
    assert positive(run["steps_per_s_without_saves"]) and positive(run["steps_per_s_with_saves"])
    assert run["throughput_ratio"] == pytest.approx(
        run["steps_per_s_with_saves"] / run["steps_per_s_without_saves"], rel=1e-12)
    assert positive(run["save_stall_s_median"]) and positive(run["save_durable_s_median"])
    assert positive(run["save_background_cpu_s_median"])
    assert positive(run["train_thread_cpu_s_per_step_without_saves"])
    assert positive(run["train_thread_cpu_s_per_step_with_saves"])
    assert run["block_ratio_median"] == statistics.median(run["block_ratios"])
    assert len(run["block_ratios"]) == run["blocks"]
    low, high = run["throughput_ratio_ci95"]  # resampled rounds: it holds the sums' ratio
    assert low <= run["throughput_ratio"] <= high
    assert run["throughput_ratio_vs_bound"] == pytest.approx(
        run["steps_per_s_with_saves"] / run["steps_per_s_with_bound"], rel=1e-12)
    low, high = run["throughput_ratio_vs_bound_ci95"]
    assert low <= run["throughput_ratio_vs_bound"] <= high
    for kind in ("bound", "floor"):  # memcpy + write + fsync; the write + fsync alone
        _kind_is_measured(run, kind)


def _kind_is_measured(run: dict, kind: str) -> None:
    assert positive(run[f"steps_per_s_with_{kind}"])
    assert run[f"{kind}_throughput_ratio"] == pytest.approx(
        run[f"steps_per_s_with_{kind}"] / run["steps_per_s_without_saves"], rel=1e-12)
    assert len(run[f"{kind}_block_ratios"]) == run["blocks"]
    assert run[f"{kind}_block_ratio_median"] == statistics.median(run[f"{kind}_block_ratios"])
    low, high = run[f"{kind}_throughput_ratio_ci95"]
    assert low <= run[f"{kind}_throughput_ratio"] <= high


@pytest.mark.slow
def test_the_writers_are_compared_on_the_same_bytes_and_the_default_is_named(bench):
    """bench.writers: both writers timed on one layout (their digests agreed, or the bench
    would have failed), the gain the ratio of the measured times, the line printed."""
    from bench.report import writer_lines
    from ckpt.writers import native_unavailable_reason

    proc, result, _ = bench
    writers = result["writers"]
    assert writers["rounds"] == 3 and positive(writers["python"]["min_s"])
    reason = native_unavailable_reason()
    assert writers["native_unavailable"] == reason
    assert writers["default"] == ("python" if reason else "native")
    if reason is None:
        assert writers["python_over_native_median"] == pytest.approx(
            writers["python"]["median_s"] / writers["native"]["median_s"], rel=1e-12)
    [line] = writer_lines(writers)
    assert f"the default here: {writers['default']}" in line or "Python writer is the default" in line
    assert line[:60] in proc.stdout


@pytest.mark.slow
def test_the_markdown_names_the_machine_and_carries_the_measured_numbers(bench):
    """bench.markdown: what docs/results/ and the README's checkpoint table are made of."""
    _, result, tmp = bench
    text = (tmp / "bench.md").read_text()
    assert text.startswith("# Checkpoint saves, ")
    assert f"`baton bench ckpt --size-gb 0.004 --rounds 3 --quick" in text
    assert result["machine"]["cpu_model"] in text
    rows = {row["name"]: row for row in result["methods"]}
    native = rows.get("baton async (native writer)")
    row = native if native is not None else rows["baton async (python writer)"]
    assert (f"| {row['name']} | {row['step_stall_s_min']:.3g} / {row['step_stall_s_median']:.3g} | "
            f"{row['step_stall_over_dcp_async_min']:.3g}× / "
            f"{row['step_stall_over_dcp_async_median']:.3g}× | ") in text
    assert f"the default here: {result['writers']['default']}" in text or "not built" in text


@pytest.mark.slow
def test_table_plot_and_mlflow_run_are_written_and_nothing_is_left(bench):
    proc, result, tmp = bench
    assert "Checkpoint saves, 0.004 GB state" in proc.stdout
    assert "baton async (python writer)" in proc.stdout
    assert "round 3/3 baton sync" in proc.stderr  # one progress line per method per round
    assert "in-step round 3/3 baton sync: stall in a step" in proc.stderr
    assert "Stall of a save inside a training step" in proc.stdout
    png = (tmp / "bench.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 10_000
    assert list((tmp / "work").iterdir()) == []  # every checkpoint removed

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp}/mlflow.db")
    [run] = client.search_runs([client.get_experiment_by_name("baton-bench").experiment_id])
    assert run.data.metrics["baton sync.stall_s_median"] == result["methods"][0]["stall_s_median"]
    every_step = result["every_step"]["default_model"]
    assert (run.data.metrics["every_step.default_model.floor_throughput_ratio_ci95_low"]
            == every_step["floor_throughput_ratio_ci95"][0])
    assert {a.path for a in client.list_artifacts(run.info.run_id)} == {"bench.json", "bench.png"}


def test_bad_size_is_one_paragraph_and_exit_2(baton):
    proc = baton("bench", "ckpt", "--size-gb", "-1")
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert proc.stderr.startswith("baton bench: error: --size-gb=-1.0: a state size in GB")
    assert len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("args, message", [
    (["--every-step-blocks", "2"], "--every-step-blocks=2: at least 3 rounds of blocks"),
    (["--tiers", "--every-step-blocks", "5"], "--every-step-blocks=5: not with --tiers"),
    (["--selective", "--every-step-blocks", "5"], "--every-step-blocks=5: not with --selective"),
])
def test_bad_every_step_blocks_is_one_paragraph_and_exit_2(baton, args, message):
    proc = baton("bench", "ckpt", *args)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert proc.stderr.startswith(f"baton bench: error: {message}")
    assert len(proc.stderr.strip().splitlines()) == 1
