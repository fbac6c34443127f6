"""Which checkpoints a selection study takes, and the `study` selection criterion."""
from __future__ import annotations

import pytest

from handoff.selection import Candidate, NoStudyRecorded, StudyWinner, select
from handoff.study_plan import StudyInput, StudyNotPossible, pick_candidates

COMMITTED = [StudyInput(10 + s, f"/ckpt/step-{s}", s) for s in (75, 25, 50, 100)]


def test_every_committed_checkpoint_in_step_order_by_default():
    assert [c.step for c in pick_candidates(3, "sft", COMMITTED, None)] == [25, 50, 75, 100]


def test_listed_steps_only():
    assert [c.checkpoint_id for c in pick_candidates(3, "sft", COMMITTED, [100, 25, 50])] == [35, 60, 110]


@pytest.mark.parametrize("stage, committed, steps, expected", [
    ("cpt", COMMITTED, None, "stage run #3 is a cpt run"),
    ("rm", COMMITTED, None, "is a rm run"),
    ("sft", COMMITTED[:2], None, "offers 2 committed checkpoint(s) [25, 75], and a correlation needs at least 3"),
    ("sft", COMMITTED, [25, 50, 60], "no committed checkpoint at step 60 (committed: [25, 50, 75, 100])"),
])
def test_a_study_that_cannot_measure_anything_is_refused(stage, committed, steps, expected):
    with pytest.raises(StudyNotPossible) as err:
        pick_candidates(3, stage, committed, steps)
    assert expected in str(err.value) and str(err.value).startswith("baton study selection:")


def _candidates():
    # Step 150 has the best score and the lowest entropy: the case the study is about.
    rows = [(50, 0.40, 0.90, 1.4), (100, 0.55, 0.70, 1.1), (150, 0.60, 0.30, 0.9)]
    return [Candidate(f"/c/{step}", step, {"accuracy": acc, "entropy": ent, "heldout_loss": loss,
                                            "pass@1": acc, "pass@4": acc, "reward_variance": 0.1})
            for step, acc, ent, loss in rows]


def test_criterion_study_picks_by_the_winning_diagnostic_in_its_direction():
    winner = StudyWinner(7, "entropy", +1, 0.83, (0.2, 1.0))
    chosen, why = select(_candidates(), "study", score_metric="accuracy", study=winner)
    assert chosen.step == 50
    assert why.startswith("highest entropy = 0.9000: the diagnostic that best predicted the RL "
                          "outcome in selection study #7 (Spearman rho +0.83, 95% CI [+0.20, +1.00])")
    lower = StudyWinner(8, "heldout_loss", -1)
    chosen, why = select(_candidates(), "study", score_metric="accuracy", study=lower)
    assert chosen.step == 150 and why.startswith("lowest heldout_loss = 0.9000")
    by_score = StudyWinner(9, "sft_score", +1)
    assert select(_candidates(), "study", score_metric="accuracy", study=by_score)[0].step == 150


def test_criterion_study_without_a_study_is_a_clear_error():
    with pytest.raises(NoStudyRecorded, match="no completed selection study"):
        select(_candidates(), "study", score_metric="accuracy")


def test_a_diagnostic_the_handoff_did_not_compute_is_a_clear_error():
    from core.errors import BatonError
    for c in (cands := _candidates()):
        del c.metrics["pass@4"]
    with pytest.raises(BatonError, match="selection study #3 chose pass@k, which this handoff did not compute"):
        select(cands, "study", score_metric="accuracy", study=StudyWinner(3, "pass@k", +1))


def test_criterion_study_is_accepted_only_at_sft_to_rl():
    from core.config import compose
    from core.errors import ConfigError
    compose(["selection@pipeline.handoffs.sft_rl.selection=study"])
    with pytest.raises(ConfigError, match="pipeline.handoffs.rm_rl.selection.criterion=study: a "
                                          "selection study measures SFT checkpoints as RL starts"):
        compose(["selection@pipeline.handoffs.rm_rl.selection=study"])
