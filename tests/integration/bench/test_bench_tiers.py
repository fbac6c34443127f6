"""`baton bench ckpt --tiers` at a tiny size: every tier is copied into and restored from,
every number is measured, every ratio is the ratio of numbers in the same JSON, the plot
and the MLflow run are written, and nothing is left in the shared tmpfs, in the work
directory or as a keeper process. The 1 GB bench is run by hand (docs/bench.md)."""
from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

TIERS = ["memory", "peer", "persistent", "remote"]
TIMES = ("restore_s", "fetch_verify_s", "read_s", "copy_s")


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    from tests.conftest import run_baton

    tmp = tmp_path_factory.mktemp("bench-tiers")
    work = tmp / "work"
    work.mkdir()
    proc = run_baton("bench", "ckpt", "--tiers", "--size-gb", "0.004", "--rounds", "3",
                     "--json", str(tmp / "tiers.json"), "--plot", str(tmp / "tiers.png"),
                     "--dir", str(work), env={"MLFLOW_TRACKING_URI": f"sqlite:///{tmp}/mlflow.db"},
                     check=True, timeout=300)
    return proc, json.loads((tmp / "tiers.json").read_text()), tmp


def positive(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


@pytest.mark.slow
def test_every_tier_is_copied_and_restored_and_every_number_is_measured(bench):
    _, result, _ = bench
    assert [row["tier"] for row in result["tiers"]] == TIERS
    assert result["rounds"] == 3
    assert positive(result["state_bytes"]) and positive(result["save_s"])
    assert result["checkpoint_bytes"] >= result["state_bytes"]  # tensors plus pickle framing
    for row in result["tiers"]:
        assert row["rounds"] == 3
        assert row["bytes"] == result["checkpoint_bytes"], row["tier"]  # a whole copy each
        for key in TIMES:
            assert positive(row[f"{key}_min"]) and positive(row[f"{key}_median"]), (row["tier"], key)
            assert row[f"{key}_min"] <= row[f"{key}_median"]
        # Each round's restore is its fetch+verify plus its read.
        assert row["restore_s_min"] >= row["fetch_verify_s_min"] + row["read_s_min"] - 1e-9
    machine = result["machine"]
    assert machine["cpu_model"] and machine["cores"] >= 1 and machine["torch_version"]
    assert machine["memory_tier_filesystem"]["type"]


@pytest.mark.slow
def test_every_ratio_is_the_ratio_of_measured_numbers(bench):
    _, result, _ = bench
    rows = {row["tier"]: row for row in result["tiers"]}
    expected = {}
    for tier in TIERS[1:]:
        for stat in ("min", "median"):
            expected[f"{tier}_over_memory_{stat}"] = (rows[tier][f"restore_s_{stat}"]
                                                      / rows["memory"][f"restore_s_{stat}"])
            expected[f"copy_{tier}_over_memory_{stat}"] = (rows[tier][f"copy_s_{stat}"]
                                                           / rows["memory"][f"copy_s_{stat}"])
    assert result["ratios"] == pytest.approx(expected, rel=1e-12)


@pytest.mark.slow
def test_disk_tiers_are_evicted_and_how_much_stayed_cached_is_measured(bench):
    _, result, _ = bench
    cache = {row["tier"]: row["page_cache"] for row in result["tiers"]}
    for tier in ("persistent", "remote"):
        assert cache[tier]["evicted"] is True
        assert 0.0 <= cache[tier]["resident_at_restore_max"] <= 1.0
        assert 0.0 <= cache[tier]["resident_after_copy_min"] <= 1.0
    assert cache["memory"]["evicted"] is False
    assert 0.0 <= cache["memory"]["resident_at_restore_max"] <= 1.0
    assert cache["peer"]["resident_at_restore_max"] is None  # held in the keeper, not in files


@pytest.mark.slow
def test_table_plot_and_mlflow_run_are_written_and_nothing_is_left(bench):
    proc, result, tmp = bench
    assert "Restore from each tier alone, checkpoint step-000001" in proc.stdout
    assert "round 3/3 persistent" in proc.stderr  # one progress line per tier per round
    png = (tmp / "tiers.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 10_000
    assert list((tmp / "work").iterdir()) == []

    memory_run_dir = Path(result["memory_run_dir"])
    assert memory_run_dir.parent.name == f"baton-tiers-{os.getuid()}"
    assert memory_run_dir.name == result["run_key"]
    assert not memory_run_dir.exists()
    keeper = Path(f"/proc/{result['keeper']['pid']}/cmdline")
    assert not keeper.exists() or b"keeper" not in keeper.read_bytes()

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp}/mlflow.db")
    [run] = client.search_runs([client.get_experiment_by_name("baton-bench").experiment_id])
    assert run.data.metrics["persistent.restore_s_median"] == result["tiers"][2]["restore_s_median"]
    assert run.data.metrics["ratios.persistent_over_memory_min"] == (
        result["ratios"]["persistent_over_memory_min"])
    assert {a.path for a in client.list_artifacts(run.info.run_id)} == {"tiers.json", "tiers.png"}


def test_tiers_with_two_rounds_is_one_paragraph_and_exit_2(baton):
    proc = baton("bench", "ckpt", "--tiers", "--rounds", "2")
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert proc.stderr.startswith("baton bench: error: --rounds=2: at least 3 with --tiers")
    assert len(proc.stderr.strip().splitlines()) == 1


def test_tiers_with_quick_is_refused(baton):
    proc = baton("bench", "ckpt", "--tiers", "--quick")
    assert proc.returncode == 2
    assert proc.stderr.startswith("baton bench: error: --quick=True: not with --tiers")
