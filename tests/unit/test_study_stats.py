"""The checkpoint-selection study: rank statistics, the analysis, the verdict and its plots."""
from __future__ import annotations

import json
import math

import pytest

from core.errors import BatonError
from handoff.study import (CandidateResult, analyze, diagnostics_from_handoff_metrics,
                           outcome, pick_by_study, verdict_markdown)
from handoff.study_plots import RANK_PLOT, plot_study
from handoff.study_stats import average_ranks, bootstrap_ci, kendall_tau_b, spearman

# Hand-computed case with ties on both sides:
#   x = [1, 2, 2, 3]  -> average ranks [1, 2.5, 2.5, 4]
#   y = [1, 3, 2, 3]  -> average ranks [1, 3.5, 2, 3.5]
# Spearman: both rank means are 2.5; deviations dx = [-1.5, 0, 0, 1.5],
#   dy = [-1.5, 1, -0.5, 1]; sum dx*dy = 2.25 + 1.5 = 3.75; sum dx^2 = sum dy^2 = 4.5;
#   rho = 3.75 / 4.5 = 5/6.
# Kendall tau-b over the 6 pairs: (0,1) (0,2) (0,3) (2,3) concordant, none discordant,
#   (1,2) tied in x, (1,3) tied in y; S = 4, n0 = 6, tx = ty = 1;
#   tau_b = 4 / sqrt((6 - 1) (6 - 1)) = 0.8.
X_TIED, Y_TIED = [1, 2, 2, 3], [1, 3, 2, 3]


def test_ties_get_their_average_rank():
    assert average_ranks([10, 20, 20, 30]) == [1.0, 2.5, 2.5, 4.0]
    assert average_ranks([3, 1, 2]) == [3.0, 1.0, 2.0]
    assert average_ranks([5, 5, 5]) == [2.0, 2.0, 2.0]


def test_spearman_of_monotone_data_is_one_and_of_reversed_data_minus_one():
    assert spearman([1, 2, 3, 4], [10, 20, 400, 800]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [8, 4, 2, 1]) == pytest.approx(-1.0)
    assert kendall_tau_b([1, 2, 3, 4], [10, 20, 400, 800]) == pytest.approx(1.0)
    assert kendall_tau_b([1, 2, 3, 4], [8, 4, 2, 1]) == pytest.approx(-1.0)


def test_spearman_and_kendall_with_ties_match_the_hand_computed_values():
    assert spearman(X_TIED, Y_TIED) == pytest.approx(5 / 6)
    assert kendall_tau_b(X_TIED, Y_TIED) == pytest.approx(0.8)


def test_a_constant_side_gives_nan():
    assert math.isnan(spearman([1, 2, 3], [7, 7, 7]))
    assert math.isnan(kendall_tau_b([4, 4, 4], [1, 2, 3]))
    assert math.isnan(spearman([1], [2]))


def test_unequal_lengths_are_refused():
    with pytest.raises(ValueError, match="equal length"):
        spearman([1, 2, 3], [1, 2])


def test_bootstrap_ci_is_deterministic_for_a_seed_and_contains_a_strong_estimate():
    x = [1, 2, 3, 4, 5, 6, 7, 8]
    y = [1.1, 1.9, 3.2, 3.9, 5.3, 5.8, 7.4, 7.9]
    first = bootstrap_ci(x, y, spearman, resamples=500, seed=3)
    assert first == bootstrap_ci(x, y, spearman, resamples=500, seed=3)
    assert first[0] <= spearman(x, y) <= first[1]
    assert first[0] > 0.5


def test_the_vectorized_bootstrap_matches_one_call_per_resample():
    x, y = [3, 1, 4, 1, 5, 9, 2], [2, 7, 1, 8, 2, 8, 1]
    for stat in (spearman, kendall_tau_b):
        looped = bootstrap_ci(x, y, lambda a, b: stat(a, b), resamples=300, seed=5)
        assert bootstrap_ci(x, y, stat, resamples=300, seed=5) == pytest.approx(looped)


def test_bootstrap_ci_of_constant_data_is_undefined():
    lo, hi = bootstrap_ci([1, 2, 3, 4], [5, 5, 5, 5], spearman, resamples=200)
    assert math.isnan(lo) and math.isnan(hi)


def test_handoff_metric_keys_map_to_study_names_and_keep_k():
    got = diagnostics_from_handoff_metrics({"accuracy": 0.5, "heldout_loss": 1.2, "entropy": 0.7,
                                            "pass@1": 0.4, "pass@4": 0.8, "score": 0.5,
                                            "reward_variance": 0.1})
    assert got == {"sft_score": 0.5, "heldout_loss": 1.2, "entropy": 0.7, "pass@1": 0.4,
                   "pass@k": 0.8, "k": 4.0, "reward_variance": 0.1}


def _candidates(sft: list[float], entropy: list[float], final: list[float]) -> list[CandidateResult]:
    return [CandidateResult(step=100 * (i + 1), checkpoint_id=i + 1, path=f"/ck/step-{i + 1}",
                            diagnostics={"sft_score": s, "entropy": e, "pass@k": 0.5 + s / 2,
                                         "k": 4.0},
                            outcome=outcome(0.1 + s / 2, f))
            for i, (s, e, f) in enumerate(zip(sft, entropy, final))]


COLLAPSE = _candidates(sft=[0.30, 0.45, 0.40, 0.60, 0.70, 0.80],
                       entropy=[1.2, 1.0, 0.8, 0.6, 0.4, 0.2],
                       final=[0.62, 0.60, 0.55, 0.50, 0.45, 0.40])


def test_entropy_wins_when_it_predicts_reward_and_the_peak_score_was_not_the_best_start():
    result = analyze(COLLAPSE, resamples=300)
    assert result.winner.diagnostic == "entropy" and result.winner.target == "final_reward"
    assert result.winner.spearman == pytest.approx(1.0)
    assert result.winner_direction == 1
    assert (result.peak_score_step, result.best_outcome_step) == (600, 100)
    assert result.peak_was_best is False
    assert result.inversions > 0
    json.dumps(result.as_dict())  # NaN never reaches JSON
    text = verdict_markdown(result, COLLAPSE)
    assert "**entropy**" in text and "was not the best RL start" in text
    assert "candidate pairs are inverted" in text and "| pass@4 |" in text


def test_without_an_inversion_the_verdict_says_so_plainly():
    candidates = _candidates(sft=[0.3, 0.4, 0.5, 0.6], entropy=[0.9, 0.5, 0.7, 0.6],
                             final=[0.40, 0.45, 0.50, 0.60])
    result = analyze(candidates, resamples=300)
    assert result.inversions == 0 and result.peak_was_best is True
    text = verdict_markdown(result, candidates)
    assert "No inversion of SFT-score rank vs RL-outcome rank appears" in text
    assert "was also the best RL start" in text


def test_a_weak_predictor_is_called_weak_when_its_interval_includes_zero():
    candidates = _candidates(sft=[0.3, 0.4, 0.5, 0.6, 0.7, 0.8],
                             entropy=[0.5, 0.9, 0.4, 0.8, 0.6, 0.7],
                             final=[0.50, 0.56, 0.45, 0.48, 0.52, 0.47])
    result = analyze(candidates, resamples=300)
    lo, hi = result.winner.spearman_ci
    assert result.winner.diagnostic == "entropy" and lo < 0 < hi
    assert ("The interval includes 0: with only K = 6 candidates the evidence is weak"
            in verdict_markdown(result, candidates))


def test_the_peak_score_tie_goes_to_the_later_step():
    candidates = _candidates(sft=[0.5, 0.7, 0.7], entropy=[0.3, 0.2, 0.1], final=[0.4, 0.6, 0.5])
    result = analyze(candidates, resamples=100)
    assert result.peak_score_step == 300 and result.best_outcome_step == 200
    assert result.peak_was_best is False


def test_a_constant_diagnostic_is_reported_as_undefined_and_as_null_in_json():
    candidates = _candidates(sft=[0.3, 0.4, 0.5], entropy=[0.5, 0.5, 0.5], final=[0.4, 0.5, 0.6])
    result = analyze(candidates, resamples=200)
    entropy = result.correlation("entropy", "final_reward").as_dict()
    assert entropy["spearman"] is None and entropy["spearman_lo"] is None
    assert result.winner.diagnostic != "entropy"


def test_plot_study_writes_a_non_empty_png_per_diagnostic_and_the_rank_plot(tmp_path):
    result = analyze(COLLAPSE, resamples=100)
    paths = plot_study(result, COLLAPSE, tmp_path / "plots")
    assert [p.name for p in paths] == ["study_sft_score.png", "study_entropy.png",
                                       "study_pass_at_k.png", RANK_PLOT]
    for path in paths:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_pick_by_study_takes_the_lowest_value_for_direction_minus_one_ties_to_later():
    metrics = [(100, {"heldout_loss": 1.0}), (200, {"heldout_loss": 0.8}),
               (300, {"heldout_loss": 0.8}), (400, {"heldout_loss": 0.9})]
    assert pick_by_study(metrics, "heldout_loss", -1) == 300
    assert pick_by_study(metrics, "heldout_loss", 1) == 100


def test_pick_by_study_names_a_missing_diagnostic():
    with pytest.raises(BatonError, match="no candidate has the diagnostic 'entropy'"):
        pick_by_study([(100, {"heldout_loss": 1.0})], "entropy", 1)
