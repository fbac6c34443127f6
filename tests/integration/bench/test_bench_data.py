"""`baton bench data` on tiny sizes: every number comes from a measurement, the ratios are
the ratios of the measured times, and the printed lines say what the JSON says."""
from __future__ import annotations

import json
import statistics

import pytest

from tests.conftest import run_baton

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench-data")
    proc = run_baton("bench", "data", "--rows", "600", "--rounds", "3", "--memory-gb", "0.02",
                     "--memory-steps", "10", "--stage-steps", "5", "--dir", str(out),
                     "--json", str(out / "data.json"), "--markdown", str(out / "data.md"), timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc, json.loads((out / "data.json").read_text()), out


def test_every_ratio_is_the_ratio_of_measured_times(bench):
    _, result, _ = bench
    t = result["tokenize"]
    assert t["rows"] == 600 and len(t["plain_s"]) == len(t["baton_s"]) == len(t["cached_s"]) == 3
    assert all(s > 0 for s in t["plain_s"] + t["baton_s"] + t["cached_s"])
    ratios = [p / b for p, b in zip(t["plain_s"], t["baton_s"])]
    assert t["throughput_ratio"] == {"min": min(ratios), "median": statistics.median(ratios)}
    assert t["cache_share"]["max"] == max(c / b for c, b in zip(t["cached_s"], t["baton_s"]))
    loading = result["loading"]
    assert loading["steps_timed"] == 4 and 0 < loading["share"]["median"] <= loading["share"]["max"] < 1
    memory = result["memory"]
    assert memory["rows_read"] == 10 * 16 and memory["dataset_bytes"] > 0.015e9
    assert memory["grown"]["RssAnon"] == memory["after"]["RssAnon"] - memory["before"]["RssAnon"]


def test_the_lines_and_the_markdown_say_what_the_json_says(bench):
    proc, result, out = bench
    t = result["tokenize"]
    line = next(x for x in proc.stdout.splitlines() if x.strip().startswith("tokenize"))
    assert f"min {t['throughput_ratio']['min']:.2f}, median {t['throughput_ratio']['median']:.2f}" in line
    assert "bar >= 0.9" in line
    for name in ("cache", "loading", "memory"):
        assert any(x.strip().startswith(name) and ("meets the bar" in x or "MISSES the bar" in x)
                   for x in proc.stdout.splitlines()), name
    text = (out / "data.md").read_text()
    assert result["machine"]["cpu_model"] in text and line.strip() in text
    assert not list(out.glob("baton-bench-data-*")), "the bench left its scratch directory"


def test_bad_sizes_are_one_paragraph_and_exit_2(baton):
    proc = baton("bench", "data", "--rounds", "2")
    assert proc.returncode == 2 and "expected at least 3 rounds" in proc.stderr
    assert "Traceback" not in proc.stderr
