"""`--config FILE`: a YAML file of settings read as overrides, the command line winning;
every per-stage example in conf/examples composes; a bad file is refused by name."""
from __future__ import annotations

from pathlib import Path

import pytest

from baton.cli import take_config_files
from core.config import compose
from core.config.config_file import file_overrides
from core.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("stage", ["cpt", "sft", "rm", "rl"])
def test_each_stage_example_composes(stage):
    # The example's model is made by examples/own_data/make_data.py --model: not here.
    cfg = compose([f"stage={stage}", *file_overrides(str(REPO / "conf" / "examples" / f"{stage}.yaml")),
                   "model.path=null"])
    section = getattr(cfg.data, stage)
    assert Path(section.train.path).is_absolute() and section.train.path.startswith(str(Path.cwd()))
    if stage == "rl":
        assert [f.name for f in cfg.rl.reward.functions] == ["compute_score", "brevity"]
        assert cfg.rl.reward.functions[1].weight == 0.1


def test_the_command_line_wins_over_the_file(tmp_path):
    settings = tmp_path / "s.yaml"
    settings.write_text("stage.max_steps: 7\ndata:\n  sft: {train: {path: 'a b.jsonl', keys: {prompt: q}}}\n"
                        "rl: {reward: {functions: [{module: 'pkg.mod:fn', weight: 2}]}}\n")
    argv, overrides = take_config_files(["run", "--config", str(settings), "stage.max_steps=9"])
    assert argv == ["run", "stage.max_steps=9"]
    cfg = compose([*overrides, "stage.max_steps=9"])
    assert cfg.stage.max_steps == 9
    assert cfg.data.sft.train.path.endswith("/a b.jsonl") and cfg.data.sft.train.keys.prompt == "q"
    assert cfg.rl.reward.functions[0].module == "pkg.mod:fn" and cfg.rl.reward.functions[0].weight == 2


def test_a_bad_file_is_refused_by_name(tmp_path):
    with pytest.raises(ConfigError, match="cannot read it"):
        file_overrides(str(tmp_path / "absent.yaml"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("data: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        file_overrides(str(bad))
    bad.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="holds a list; expected a mapping"):
        file_overrides(str(bad))
    bad.write_text("data: {sft: {train: {paht: x.jsonl}}}\n")
    with pytest.raises(ConfigError, match="unknown config key 'data.sft.train.paht'"):
        compose(file_overrides(str(bad)))


def test_the_own_data_example_composes_onto_what_make_data_writes(tmp_path, monkeypatch):
    """examples/own_data/baton.yaml names exactly the files make_data.py writes (paths are
    relative to where baton runs: here, a directory holding what make_data wrote)."""
    from examples.own_data.make_data import write_all

    written = write_all(tmp_path / "runs" / "own-data" / "data")
    monkeypatch.chdir(tmp_path)
    cfg = compose([*file_overrides(str(REPO / "examples" / "own_data" / "baton.yaml")), "model.path=null"])
    for stage in ("cpt", "sft", "rm", "rl"):
        section = getattr(cfg.data, stage)
        assert section.train.path in {str(path) for path in written.values()}, (stage, section.train.path)
    assert cfg.data.cpt.eval.path == str(written["cpt_eval"])
    assert [Path(f.path) for f in cfg.rl.reward.functions] == [tmp_path / "examples" / "own_data" / "reward.py"] * 2
    assert cfg.rl.reward.rm_weight == 0.5 and cfg.data.sft.train.format == "messages"


def test_baton_config_prints_the_resolved_data_section(tmp_path, monkeypatch, capsys):
    """What `baton config` shows a user: their data and reward settings, paths made absolute,
    roles they did not remap at their own names, the stages they left alone empty."""
    import yaml

    from baton.cli import main

    monkeypatch.chdir(tmp_path)
    settings = tmp_path / "s.yaml"
    settings.write_text("data: {sft: {train: {path: chats.jsonl, format: messages}, eval_fraction: 0.05}}\n")
    code = main(["config", "--config", str(settings), "data.sft.train.keys.messages=conversation",
                 "data.max_length=2048", "data.truncation=left",
                 "rl.reward.functions=[{path:reward.py,name:score,weight:2}]", "rl.reward.rm_weight=0.5"])
    assert code == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    sft = printed["data"]["sft"]
    assert sft["train"]["path"] == str(tmp_path / "chats.jsonl") and sft["train"]["format"] == "messages"
    assert sft["train"]["keys"]["messages"] == "conversation" and sft["eval_fraction"] == 0.05
    assert printed["data"]["max_length"] == 2048 and printed["data"]["truncation"] == "left"
    assert printed["data"]["cpt"]["train"]["path"] is None  # built-in tasks for CPT
    function = printed["rl"]["reward"]["functions"][0]
    assert (function["path"], function["name"], function["weight"]) == (str(tmp_path / "reward.py"), "score", 2.0)
    assert printed["rl"]["reward"]["rm_weight"] == 0.5 and printed["stage"]["reward_model_weight"] == 0.5
