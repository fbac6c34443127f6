"""Your own model, data and reward, end to end with real processes: the whole pipeline on
two model families (Llama: BOS, no pad; Qwen2: no BOS, ChatML) with every file format
and a reward-function file; datasets recorded in lineage and MLflow; `baton rerun` of
SFT -> RL reproducing on file data and naming a changed dataset; the export loading in
transformers with equal logits; bit-exact resume on file data; a changed dataset
refused on resume; bad input refused before any worker starts."""
from __future__ import annotations

import json
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from examples.own_data.make_data import write_all
from stages.data.files import content_digest, resolve
from bench.tiny_hf_model import build_tiny_model
from tests.conftest import metrics, run_baton

pytestmark = pytest.mark.slow
REWARD = Path(__file__).resolve().parents[3] / "examples" / "own_data" / "reward.py"
# One process per stage: resharding between layouts is the pipeline module's subject, and
# the two pipelines here run at once on two cores.
SMALL = ["stage.max_steps=2", "stage.save_every=1", "stage.eval_every=2", "stage.eval_samples=4",
         "data.max_length=64", "rl.reward.rm_weight=0.5",
         *(f"pipeline.parallel.{stage}=single" for stage in ("cpt", "sft", "rm", "rl")),
         *(f"pipeline.handoffs.{h}.selection.{k}={v}" for h in ("cpt_sft", "sft_rm", "sft_rl", "rm_rl")
           for k, v in (("probe_prompts", 2), ("samples_per_prompt", 4), ("k", 2)))]
REWARDS = (f"rl.reward.functions=[{{path:'{REWARD}',name:compute_score,weight:1.0}},"
           f"{{path:'{REWARD}',name:brevity,weight:0.1}}]")


def _data_overrides(family: str, paths: dict) -> list[str]:
    """Every format on each family (a glob of JSON Lines, JSON, Parquet, a save_to_disk
    directory), each family in other stages; strings and chat message lists both."""
    if family == "llama":
        return [f"data.cpt.train.path={paths['cpt']}", f"data.cpt.eval.path={paths['cpt_eval']}",
                f"data.sft.train.path={paths['sft_messages']}", "data.sft.train.format=messages",
                f"data.rm.train.path={paths['rm_saved']}",
                f"data.rl.train.path={paths['rl']}", "data.rl.train.keys.prompt=question",
                f"data.rl.eval.path={paths['rl_eval_chats']}", REWARDS]
    return [f"data.cpt.train.path={paths['cpt']}", f"data.cpt.eval.path={paths['cpt_eval_parquet']}",
            f"data.sft.train.path={paths['sft_pairs']}", "data.sft.train.keys.prompt=question",
            "data.sft.train.keys.completion=response",
            f"data.rm.train.path={paths['rm_chats']}", f"data.rm.eval.path={paths['rm_saved']}",
            f"data.rl.train.path={paths['rl']}", "data.rl.train.keys.prompt=question", REWARDS]


@pytest.fixture(scope="module")
def workload(tmp_path_factory):
    root = tmp_path_factory.mktemp("own")
    models = {family: build_tiny_model(root / family, family) for family in ("llama", "qwen2")}
    return root, models, write_all(root / "data")


@pytest.fixture(scope="module")
def pipelines(workload):
    """One whole pipeline per family, both at once (two cores; most of each is start-up)."""
    root, models, paths = workload

    def pipeline(family: str):
        run_dir = root / f"run-{family}"
        proc = run_baton("run", f"run.dir={run_dir}", f"model.path={models[family]}", *SMALL,
                         *_data_overrides(family, paths), timeout=1500)
        assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-5000:]
        return run_dir, proc.stdout
    with ThreadPoolExecutor(2) as pool:
        runs = {family: pool.submit(pipeline, family) for family in models}
        return {family: future.result() for family, future in runs.items()}


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_the_whole_pipeline_runs_on_your_model_data_and_reward(pipelines, family):
    run_dir, stdout = pipelines[family]
    assert "pipeline run #1 completed" in stdout
    rl = metrics(run_dir / "pipeline-0001", "rl")
    assert {1, 2} <= set(rl)
    # Your functions' reward (brevity takes up to 0.1 off any answer), with the reward
    # model's: not the built-in checker's 0 or 1.
    assert any(rl[s]["reward"] not in (0.0, 1.0) for s in (1, 2))
    assert {"eval_reward", "eval_pass_at_1", "eval_pass_at_4"} <= set(rl[2])
    # The RM stage's reward model scored every sample too, added at rl.reward.rm_weight=0.5.
    from stages.rl.journal_view import show
    scored = [row["reward"] for row in show(run_dir / "pipeline-0001", 1, None)["rows"]]
    assert scored and all(r["rm"] is not None for r in scored) and any(r["rm"] != 0 for r in scored)
    assert all(r["total"] == pytest.approx(r["checker"] + 0.5 * r["rm"]) for r in scored)
    handoffs = [json.loads(run_baton("lineage", "handoff", str(i), "--json", f"run.dir={run_dir}",
                                     check=True).stdout) for i in (1, 2, 3, 4)]
    into_rl = next(h for h in handoffs if (h["from_stage"], h["to_stage"]) == ("sft", "rl"))
    chosen = next(c for c in into_rl["candidates"] if c["chosen"])
    # Judged on your RL prompts with your reward function: pass@k and accuracy exist.
    assert {"heldout_loss", "entropy", "accuracy", "pass@1", "pass@2"} <= set(chosen["metrics"])
    assert into_rl["carry_policy"]["data_position"]["row"] == 0
    assert into_rl["carry_policy"]["data_position"]["dataset"].endswith("rl/prompts.jsonl")


def test_lineage_and_mlflow_record_every_dataset(pipelines, workload):
    from mlflow import MlflowClient

    _, _, paths = workload
    run_dir, _ = pipelines["llama"]
    tree = json.loads(run_baton("lineage", "show", "--json", f"run.dir={run_dir}", check=True).stdout)
    by_stage = {run["stage"]: run for run in tree["stage_runs"]}
    sft = {d["role"]: d for d in by_stage["sft"]["datasets"]}
    assert sft["train"]["path"] == str(paths["sft_messages"])
    assert sft["train"]["digest"] == content_digest(resolve("sft", str(paths["sft_messages"])))
    assert sft["train"]["format"] == "messages" and sft["train"]["rows_read"] == 2 * 16
    assert sft["train"]["rows"] + sft["eval"]["rows"] == 120 and sft["train"]["chat_template"]
    cpt = {d["role"]: d for d in by_stage["cpt"]["datasets"]}
    assert cpt["eval"]["path"] == str(paths["cpt_eval"]) and cpt["eval"]["rows"] == 24
    rl = {d["role"]: d for d in by_stage["rl"]["datasets"]}
    assert rl["train"]["keys"] == {"prompt": "question", "answer": "answer"}
    # Held-out prompts as chat message lists, in JSON: read, and recorded as read.
    assert rl["eval"]["path"] == str(paths["rl_eval_chats"]) and rl["eval"]["rows"] == 24
    assert rl["eval"]["format"] == "prompts"
    shown = run_baton("lineage", "show", f"run.dir={run_dir}", check=True).stdout
    assert f"train data {paths['rl']}  prompts" in shown
    client = MlflowClient(tracking_uri=f"sqlite:///{run_dir / 'mlflow.db'}")
    run = client.get_run(by_stage["sft"]["mlflow_run_id"])
    # MLflow's UI opens an experiment of this kind on its training runs (not GenAI traces).
    kind = client.get_experiment(run.info.experiment_id).tags.get("mlflow.experimentKind")
    assert kind == "custom_model_development"
    inputs = {[t.value for t in i.tags if t.key == "mlflow.data.context"][0]: i.dataset
              for i in run.inputs.dataset_inputs}
    assert set(inputs) == {"training", "eval"}
    assert inputs["training"].name == "sft-train: chats.parquet"
    assert json.loads(inputs["training"].source) == {"uri": str(paths["sft_messages"])}
    assert sft["train"]["digest"].split(":", 1)[1].startswith(inputs["training"].digest)
    assert json.loads(inputs["training"].profile)["rows_read"] == 32


def test_the_export_loads_in_transformers_with_equal_logits(pipelines, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ckpt import manifest as manifest_io
    from ckpt.compat import read_meta
    from stages.export import load_checkpoint_model

    run_dir, _ = pipelines["qwen2"]
    final = sorted((run_dir / "pipeline-0001" / "sft" / "checkpoints").glob("step-*"))[-1]
    out = tmp_path / "exported"
    run_baton("ckpt", "export", str(final), str(out), check=True)
    # baton trains with eager attention (stages.model); the same kernels compare the bits.
    exported = AutoModelForCausalLM.from_pretrained(str(out), attn_implementation="eager")
    tokenizer = AutoTokenizer.from_pretrained(str(out))
    assert tokenizer.chat_template and "<|im_start|>" in tokenizer.chat_template
    manifest = manifest_io.verify(final, checksums=False)
    ours, _ = load_checkpoint_model(final, manifest, read_meta(final, manifest))
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "What is 2 plus 3?"}],
                                        add_generation_prompt=True, return_tensors="pt", return_dict=True)
    # Fresh buffers for both: a BLAS kernel may sum in another order for a tensor at another
    # memory alignment (from_pretrained maps the safetensors file), which says nothing here.
    for model in (exported, ours):
        for param in model.parameters():
            param.data = param.data.clone()
    with torch.no_grad():
        expected = ours.eval()(input_ids=ids["input_ids"]).logits
        got = exported.eval()(input_ids=ids["input_ids"]).logits
    assert torch.equal(expected, got)


def test_rerun_of_sft_to_rl_reproduces_on_file_data_and_names_a_changed_dataset(pipelines, workload):
    run_dir, _ = pipelines["qwen2"]
    handoff = next(i for i in (1, 2, 3, 4) if json.loads(run_baton(
        "lineage", "handoff", str(i), "--json", f"run.dir={run_dir}", check=True).stdout)["to_stage"] == "rl"
        and json.loads(run_baton("lineage", "handoff", str(i), "--json", f"run.dir={run_dir}",
                                 check=True).stdout)["from_stage"] == "sft")
    same = run_baton("rerun", "--handoff", str(handoff), f"run.dir={run_dir}", timeout=900)
    assert same.returncode == 0, same.stdout[-4000:] + same.stderr[-4000:]
    assert "REPRODUCED bit for bit" in same.stdout
    _, _, paths = workload
    prompts = Path(paths["rl"])
    original = prompts.read_text()
    rows = [json.loads(line) for line in original.splitlines()]
    for row in rows:  # every prompt changes, so whichever the sampler draws, the run differs
        row["question"] += " Answer briefly."
    try:
        prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
        changed = run_baton("rerun", "--handoff", str(handoff), f"run.dir={run_dir}", timeout=900)
    finally:
        prompts.write_text(original)
    assert changed.returncode == 1, changed.stdout[-4000:] + changed.stderr[-4000:]
    assert (f"the data changed, which explains it: train data {prompts} has content sha256:"
            in changed.stdout), changed.stdout[-4000:]


# -- resume on file data --------------------------------------------------------------------
N, K = 5, 2  # 24 train rows / global batch 8: an epoch is 3 steps, so steps 3-5 cross into epoch 2


def _cpt(run_dir: Path, model: Path, data: Path, ws: int, *extra: str, check: bool = True):
    return run_baton("stage", "cpt", f"run.dir={run_dir}", f"model.path={model}",
                     f"data.cpt.train.path={data / 'train.jsonl'}", f"data.cpt.eval.path={data / 'eval.jsonl'}",
                     "data.max_length=32", "stage.global_batch=8", "stage.micro_batch=2",
                     f"stage.max_steps={N}", f"stage.save_every={K}", "stage.eval_every=5",
                     f"parallel.world_size={ws}", f"parallel.zero_stage={1 if ws == 2 else 0}",
                     *extra, check=check)


def _corpus(directory: Path) -> Path:
    directory.mkdir(parents=True)
    lines = [json.dumps({"text": f"line {i}: {i} plus {i} is {2 * i}."}) for i in range(28)]
    (directory / "train.jsonl").write_text("\n".join(lines[:24]) + "\n")
    (directory / "eval.jsonl").write_text("\n".join(lines[24:]) + "\n")
    return directory


@pytest.mark.parametrize("ws", [1, 2])
def test_resume_on_file_data_is_bit_exact_mid_epoch_and_across_the_epoch_boundary(workload, tmp_path, ws):
    from ckpt.diff import diff_checkpoints

    _, models, _ = workload
    data = _corpus(tmp_path / "data")
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    _cpt(straight, models["qwen2"], data, ws)
    step_k = straight / "cpt" / "checkpoints" / f"step-{K:06d}"
    assert json.loads((step_k / "data.json").read_text())["epoch"] == 0  # mid-epoch
    _cpt(resumed, models["qwen2"], data, ws, f"resume={step_k}")
    final = f"cpt/checkpoints/step-{N:06d}"
    report = diff_checkpoints(straight / final, resumed / final)
    assert report.identical, [f for f in report.files if not f.identical] or report
    assert json.loads((straight / final / "data.json").read_text())["epoch"] == 1
    a, b = metrics(straight, "cpt"), metrics(resumed, "cpt")
    assert [a[s]["loss"] for s in range(K + 1, N + 1)] == [b[s]["loss"] for s in range(K + 1, N + 1)]


def test_file_data_is_read_in_the_same_order_at_world_size_1_and_2(workload, tmp_path):
    """The sampler's order does not depend on the world size, on file rows too: the first
    step of each reads the same rows (the same token count, the same loss up to the
    all-reduce's rounding) and ends at the same sample index."""
    _, models, _ = workload
    data = _corpus(tmp_path / "data")
    runs = {ws: tmp_path / f"ws{ws}" for ws in (1, 2)}
    for ws, run in runs.items():
        _cpt(run, models["qwen2"], data, ws, "stage.max_steps=1", "stage.save_every=1")
    first = {ws: metrics(run, "cpt")[1] for ws, run in runs.items()}
    assert first[1]["tokens"] == first[2]["tokens"]
    assert first[1]["loss"] == pytest.approx(first[2]["loss"], rel=1e-5)
    positions = [json.loads((run / "cpt" / "checkpoints" / "step-000001" / "data.json").read_text())
                 for run in runs.values()]
    assert positions[0] == positions[1]


def test_a_changed_dataset_is_refused_on_resume_by_name_unless_allowed(workload, tmp_path):
    _, models, _ = workload
    data = _corpus(tmp_path / "data")
    run = tmp_path / "run"
    _cpt(run, models["llama"], data, 1, "stage.max_steps=2", "stage.save_every=2")
    train = data / "train.jsonl"
    saved = json.loads((run / "cpt" / "checkpoints" / "step-000002" / "meta.json").read_text())
    before = saved["data_plan"]["train"]["digest"]
    assert before == content_digest(resolve("data.cpt.train.path", str(train)))
    train.write_text(train.read_text() + json.dumps({"text": "one more row"}) + "\n")
    after = content_digest(resolve("data.cpt.train.path", str(train)))
    assert before != after
    named = f"train data {train} has content {after}, the checkpoint's had {before}"
    refused = _cpt(run, models["llama"], data, 1, "resume=latest", check=False)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert named in refused.stderr.replace("\n", " ")
    assert "data.allow_changed=true" in refused.stderr
    assert not (run / "cpt" / "checkpoints" / f"step-{N:06d}").exists()
    allowed = _cpt(run, models["llama"], data, 1, "resume=latest", "data.allow_changed=true")
    assert allowed.returncode == 0
    meta = json.loads((run / "cpt" / "checkpoints" / f"step-{N:06d}" / "meta.json").read_text())
    assert meta["data_plan"]["allowed_change"]["changes"][0] == named


# -- bad input, refused before any worker starts ----------------------------------------------
def test_bad_input_is_refused_before_any_worker_starts(workload, tmp_path):
    _, models, paths = workload
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{"text": "cut off\n')
    broken_reward = tmp_path / "reward.py"
    broken_reward.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                             "    return 'yes'\n")
    cases = [
        (["cpt", f"data.cpt.train.path={bad}"], f"{bad}:2 is not valid JSON"),
        (["rl", f"data.rl.train.path={paths['rl']}", "data.rl.train.keys.prompt=question",
          f"rl.reward.functions=[{{path:'{broken_reward}'}}]"],
         "returned 'yes'; expected a finite number"),
    ]
    for (stage, *overrides), needle in cases:
        run = tmp_path / f"run-{stage}"
        proc = run_baton("stage", stage, f"run.dir={run}", f"model.path={models['qwen2']}",
                         "data.max_length=64", *overrides)
        assert proc.returncode == 2, proc.stderr[-3000:]
        assert needle in proc.stderr and "Traceback" not in proc.stderr
        assert not (run / stage / "checkpoints").exists() and not (run / stage / "result.json").exists()
    shutil.rmtree(tmp_path / "run-cpt", ignore_errors=True)
