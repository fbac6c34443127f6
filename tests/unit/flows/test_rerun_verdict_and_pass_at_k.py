"""The re-run verdict names the first divergence; pass@k is the unbiased estimator."""
from __future__ import annotations

import json

import pytest

from ckpt.reproduce import compare_runs, compare_traces
from handoff.diagnostics import pass_at_k


def test_identical_traces_reproduce_and_wall_clock_is_ignored():
    a = {1: {"step": 1, "loss": 2.5, "seconds": 0.1}, 2: {"step": 2, "loss": 2.25, "seconds": 0.1}}
    b = {1: {"step": 1, "loss": 2.5, "seconds": 9.0}, 2: {"step": 2, "loss": 2.25, "seconds": 3.0}}
    assert compare_traces(a, b) == (None, 2)


def test_the_first_differing_step_and_metric_are_named(tmp_path):
    original, rerun = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    original.write_text("\n".join(json.dumps({"step": s, "loss": 1.0 / s}) for s in (1, 2, 3)))
    rerun.write_text("\n".join(json.dumps({"step": s, "loss": 1.0 / s + (s == 2) * 1e-7})
                               for s in (1, 2, 3)))
    verdict = compare_runs(original, rerun, None, None)
    assert not verdict.reproduced
    assert verdict.first_divergence["step"] == 2 and verdict.first_divergence["metric"] == "loss"
    assert verdict.summary().startswith("DIVERGED at step 2: loss original 0.5 vs re-run")


def test_a_missing_step_is_a_divergence():
    divergence, _ = compare_traces({1: {"step": 1}, 2: {"step": 2}}, {1: {"step": 1}})
    assert divergence["step"] == 2 and divergence["metric"] == "presence"


@pytest.mark.parametrize("n,c,k,expected", [(8, 0, 4, 0.0), (8, 8, 1, 1.0), (8, 2, 1, 0.25),
                                            (8, 2, 4, 1 - (15 / 70)), (4, 1, 4, 1.0)])
def test_pass_at_k_is_the_unbiased_estimator(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected)
