"""The lineage graph layout and the handoff description, from records alone."""
from __future__ import annotations

from datetime import datetime, timezone

from lineage import records as r
from lineage.graph import PipelineView, layout, lineage_figure, stage_depths
from lineage.mlflow_bridge import candidates_table, handoff_markdown

NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)


def _run(id_, stage, attempt=1):
    return r.StageRun(id_, 1, stage, attempt, None, {}, "completed", NOW, NOW, None, None)


def _handoff(id_, src, to_stage, to_run, entropy=1.2):
    cands = (r.Candidate(11, 20, "/c/20", {"score": 0.6, "entropy": 1.3}, True, None, 1, True),
             r.Candidate(12, 30, "/c/30", {"score": 0.7, "entropy": 0.4}, False, "entropy 0.4 < 1.0",
                         None, False))
    return r.Handoff(id_, src, "sft", to_stage, to_run, "entropy_floor", {"min_entropy": 1.0}, 11,
                     20, entropy, "best score above the floor", {"carried": ["weights"]}, None,
                     None, NOW, cands)


def _view():
    runs = (_run(1, "cpt"), _run(2, "sft"), _run(3, "rm"), _run(4, "rl"), _run(5, "rl", 2))
    handoffs = (_handoff(1, 1, "sft", 2), _handoff(2, 2, "rm", 3), _handoff(3, 2, "rl", 4),
                _handoff(4, 3, "rl", 4))
    pipeline = r.PipelineRun(1, "baton", {}, "h", 1, "v", None, None, "completed", NOW, None)
    return PipelineView(pipeline, runs, {}, handoffs)


def test_stages_are_placed_by_their_longest_chain_of_handoffs():
    assert stage_depths(_view()) == {"cpt": 0, "sft": 1, "rm": 2, "rl": 3}


def test_attempts_of_one_stage_stack_in_the_same_column():
    pos = layout(_view())
    assert pos[4][0] == pos[5][0] and pos[5][1] < pos[4][1]


def test_the_graph_renders_to_a_png(tmp_path):
    fig = lineage_figure(_view())
    fig.savefig(tmp_path / "g.png")
    assert (tmp_path / "g.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_handoff_description_says_what_won_and_why_and_lists_rejections():
    text = handoff_markdown(_handoff(3, 2, "rl", 4))
    assert "Chose checkpoint 11 at step **20** by criterion `entropy_floor`" in text
    assert "**Why:** best score above the floor" in text
    assert "| 1 ✔ | 20 | yes | entropy=1.3, score=0.6 |  |" in text
    assert "| - | 30 | no | entropy=0.4, score=0.7 | entropy 0.4 < 1.0 |" in text


def test_the_candidates_table_has_one_column_per_metric():
    table = candidates_table(_handoff(3, 2, "rl", 4))
    assert table["metric.entropy"] == [1.3, 0.4]
    assert table["chosen"] == [True, False]
