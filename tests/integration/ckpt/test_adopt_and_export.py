"""Checkpoints into and out of baton: `baton ckpt adopt` and `baton ckpt export`.

A plain DeepSpeed ZeRO-3 save (no baton involved) and a Hugging Face directory are
adopted, verified, traced in lineage, trained from and refused as resume targets; a
payload outside the allow-list is refused without running. Checkpoints of a pipeline
CPT stage (ZeRO 0), an SFT stage (ZeRO 3) and an RM stage are exported and loaded back
with `from_pretrained`, giving the checkpoint's own logits; `--register` creates an
MLflow model version of the stage run.
"""
from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ckpt.content_digest import content_digest_of
from tests.conftest import REPO, run_baton

pytestmark = pytest.mark.slow

# One optimizer step of plain DeepSpeed (CPU, gloo, torch's AdamW), then save_checkpoint:
# what a user brings from a training code that is not baton.
PLAIN_DEEPSPEED = r"""
import sys
import deepspeed, torch
from transformers import AutoModelForCausalLM
model_dir, out, zero = sys.argv[1], sys.argv[2], int(sys.argv[3])
deepspeed.init_distributed(dist_backend="gloo")
torch.manual_seed(0)
model = AutoModelForCausalLM.from_pretrained(model_dir)
config = {"train_batch_size": 2, "train_micro_batch_size_per_gpu": 2,
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "torch_adam": True}},
          "zero_optimization": {"stage": zero, "stage3_param_persistence_threshold": 0}}
engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
ids = torch.randint(4, 20, (2, 8))
engine.backward(engine(input_ids=ids, labels=ids).loss)
engine.step()
engine.save_checkpoint(out)
"""

# A model-states file whose unpickling would run a command (os.system via __reduce__).
HOSTILE = r"""
import os, sys, torch
class Payload:
    def __reduce__(self):
        return (os.system, ("touch " + sys.argv[2],))
torch.save({"module": {}, "payload": Payload()}, sys.argv[1])
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _python(script: str, *args: str, env: dict | None = None) -> None:
    proc = subprocess.run([sys.executable, "-c", script, *args], cwd=REPO, text=True,
                          capture_output=True, timeout=300, env={**os.environ, **(env or {})})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def _consolidated(path: Path) -> dict:
    from ckpt.weights import consolidated_state_dict
    return consolidated_state_dict(path)


def _same_weights(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k].float(), b[k].float()) for k in a)


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> Path:
    """A run home with the built-in model in it (what every stage here trains)."""
    from core.config import compose
    from stages.model import ensure_model_dir

    run_dir = tmp_path_factory.mktemp("home")
    ensure_model_dir(compose([f"run.dir={run_dir}"]))
    return run_dir


@pytest.fixture(scope="module")
def foreign(home, tmp_path_factory) -> Path:
    """A plain DeepSpeed ZeRO-3 checkpoint root (`latest` + global_step1/) of the built-in model."""
    from stages.worker_env import worker_env

    root = tmp_path_factory.mktemp("foreign") / "ds"
    env = {**worker_env(), "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())}
    _python(PLAIN_DEEPSPEED, str(home / "model"), str(root), "3", env=env)
    assert (root / "latest").read_text().strip() == "global_step1"
    return root


@pytest.fixture(scope="module")
def adopted(home, foreign) -> tuple[Path, str]:
    proc = run_baton("ckpt", "adopt", str(foreign), "--name", "plain-ds", f"run.dir={home}",
                     check=True)
    return home / "adopted" / "plain-ds", proc.stdout


@pytest.fixture(scope="module")
def sft_from_adopted(home, adopted) -> Path:
    """One SFT step under ZeRO 3 started from the adopted checkpoint."""
    proc = run_baton("stage", "sft", f"stage.init_from={adopted[0]}", "stage.max_steps=1",
                     "stage.save_every=1", "stage.eval_samples=4", "parallel.zero_stage=3",
                     f"run.dir={home}", check=True)
    assert f"init_from {adopted[0]}: new parameters (freshly initialised) [], dropped []" in proc.stdout
    return home / "sft" / "checkpoints" / "step-000001"


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory) -> Path:
    """`baton run --stages cpt`: a CPT checkpoint (ZeRO 0) recorded in lineage and MLflow."""
    run_dir = tmp_path_factory.mktemp("pipeline")
    run_baton("run", "--stages", "cpt", f"run.dir={run_dir}", "stage.max_steps=2",
              "stage.save_every=2", "stage.eval_every=2", "stage.eval_samples=4", check=True,
              timeout=900)
    return run_dir


# -- adopt ----------------------------------------------------------------------------

def test_verify_says_a_foreign_directory_is_a_deepspeed_checkpoint_or_a_hf_model(home, foreign):
    for path, expected in [
            (foreign, "a DeepSpeed checkpoint root (`latest` names global_step1"),
            (foreign / "global_step1", "a DeepSpeed checkpoint (zero_pp_rank_0_mp_rank_00_model_states.pt"),
            (home / "model", "a Hugging Face model directory (config.json + model.safetensors)")]:
        proc = run_baton("ckpt", "verify", str(path))
        assert proc.returncode == 1, proc.stderr
        assert expected in proc.stderr and "without a baton manifest" in proc.stderr
        assert f"baton ckpt adopt {path}" in proc.stderr
        assert "the save never finished" not in proc.stderr


def test_adopt_prints_the_next_command_and_the_copy_verifies(home, adopted):
    path, stdout = adopted
    assert (f"next: baton stage sft stage.init_from={path} run.dir={home}") in stdout
    proc = run_baton("ckpt", "verify", str(path))
    assert proc.returncode == 0, proc.stderr
    assert "OK" in proc.stdout and "checksums match" in proc.stdout


def test_the_adopted_copy_records_its_origin_and_keeps_the_foreign_weights(home, foreign, adopted):
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
    from safetensors.torch import load_file

    path, _ = adopted
    manifest = json.loads((path / "manifest.json").read_text())
    origin = manifest["extra"]["adopted"]
    assert origin["kind"] == "deepspeed" and origin["source"] == str(foreign)
    assert set(origin["absent"]) == {"optimizer", "scheduler", "rng", "data", "progress"}
    for name, digest in origin["sha256"].items():
        assert hashlib.sha256((foreign / "global_step1" / name).read_bytes()).hexdigest() == digest
    assert manifest["parallel"] == {"world_size": 1, "zero_stage": 3}
    # Our own file, made above: DeepSpeed's own reader is the reference here.
    original = get_fp32_state_dict_from_zero_checkpoint(str(foreign), tag="global_step1")
    assert _same_weights(_consolidated(path), original)
    assert not _same_weights(original, load_file(str(home / "model" / "model.safetensors"))), \
        "the foreign step changed no weight: the test could not tell them apart"


def test_a_stage_starts_from_the_adopted_checkpoint(sft_from_adopted):
    verify = run_baton("ckpt", "verify", str(sft_from_adopted))
    assert verify.returncode == 0, verify.stderr


def test_resuming_from_an_adopted_checkpoint_is_refused(home, foreign, adopted):
    path, _ = adopted
    proc = run_baton("stage", "cpt", f"resume={path}", f"run.dir={home}")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"adopted from {foreign} (a DeepSpeed checkpoint): it has no optimizer/scheduler/rng/data/progress state, so " \
           "it cannot be resumed; use it as stage.init_from=" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_lineage_trace_finds_the_adopted_checkpoint(home, adopted):
    path, _ = adopted
    proc = run_baton("lineage", "trace", str(path), "--json", f"run.dir={home}", check=True)
    [link] = json.loads(proc.stdout)
    assert link["checkpoint"]["path"] == str(path) and link["checkpoint"]["format"] == "deepspeed"
    assert link["stage_run"]["stage"] == "cpt" and link["stage_run"]["status"] == "completed"


def test_a_hugging_face_directory_is_adopted_with_its_weights(home, tmp_path):
    """A model with tied embeddings, as many published ones are: its safetensors hold the
    embedding once and no lm_head.weight."""
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM

    hf_dir = tmp_path / "hf-model"
    config = AutoConfig.from_pretrained(str(home / "model"), tie_word_embeddings=True)
    torch.manual_seed(7)
    AutoModelForCausalLM.from_config(config).save_pretrained(str(hf_dir))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (hf_dir / name).write_bytes((home / "model" / name).read_bytes())
    assert "lm_head.weight" not in load_file(str(hf_dir / "model.safetensors"))
    proc = run_baton("ckpt", "adopt", str(hf_dir), "--name", "from-hf", f"run.dir={home}", check=True)
    path = home / "adopted" / "from-hf"
    assert (f"next: baton stage sft stage.init_from={path} model.path={hf_dir} "
            f"run.dir={home}") in proc.stdout
    assert json.loads((path / "manifest.json").read_text())["extra"]["adopted"]["kind"] == "hf"
    assert run_baton("ckpt", "verify", str(path)).returncode == 0
    assert _same_weights(_consolidated(path), load_file(str(hf_dir / "model.safetensors")))
    trace = run_baton("lineage", "trace", str(path), "--json", f"run.dir={home}", check=True)
    assert json.loads(trace.stdout)[0]["checkpoint"]["format"] == "hf"
    out = tmp_path / "export"
    run_baton("ckpt", "export", str(path), str(out), check=True)
    _logits_match(out, path, AutoModelForCausalLM)


def test_a_payload_outside_the_allow_list_is_refused_and_never_runs(home, tmp_path):
    tag = tmp_path / "hostile" / "global_step1"
    tag.mkdir(parents=True)
    marker = tmp_path / "payload-ran"
    _python(HOSTILE, str(tag / "mp_rank_00_model_states.pt"), str(marker))
    proc = run_baton("ckpt", "adopt", str(tag), "--name", "hostile", f"run.dir={home}")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "mp_rank_00_model_states.pt: contains objects outside the allow-list" in proc.stderr
    assert "nothing in it was executed" in proc.stderr and "Traceback" not in proc.stderr
    assert not marker.exists(), "the payload ran"
    assert not (home / "adopted" / "hostile").exists()
    assert not (home / "adopted" / ".hostile.adopting").exists()


def test_adopt_refuses_a_baton_checkpoint_and_an_unknown_directory(home, adopted, tmp_path):
    proc = run_baton("ckpt", "adopt", str(adopted[0]), f"run.dir={home}")
    assert proc.returncode == 2 and "already a baton checkpoint" in proc.stderr
    proc = run_baton("ckpt", "adopt", str(tmp_path), f"run.dir={home}")
    assert proc.returncode == 2 and "nothing to adopt: expected a DeepSpeed checkpoint" in proc.stderr


# -- export ---------------------------------------------------------------------------

def _logits_match(export_dir: Path, checkpoint: Path, auto_class) -> None:
    """The exported directory, loaded by transformers, against the checkpoint's weights
    loaded into the model built from the checkpoint's model directory."""
    model_dir = json.loads((checkpoint / "meta.json").read_text())["model_dir"]
    exported = auto_class.from_pretrained(str(export_dir), attn_implementation="eager").eval()
    extra = {"num_labels": 1} if "Sequence" in auto_class.__name__ else {}
    reference = auto_class.from_pretrained(str(model_dir), attn_implementation="eager", **extra).eval()
    loaded = reference.load_state_dict(_consolidated(checkpoint), strict=False)
    tied = {"lm_head.weight"} if reference.config.tie_word_embeddings else set()
    assert not loaded.unexpected_keys and set(loaded.missing_keys) <= tied, loaded
    assert exported.dtype == torch.float32
    assert _same_weights(exported.state_dict(), reference.state_dict())
    # Same bits, fresh buffers: CPU BLAS kernels may sum in another order for a tensor that
    # sits at another memory alignment (from_pretrained maps safetensors files), which
    # would move the last bit of a logit and say nothing about the export.
    for model in (exported, reference):
        for param in model.parameters():
            param.data = param.data.clone()
    ids = torch.tensor([[1, 14, 24, 15, 33, 10, 11, 12, 30]])
    with torch.no_grad():
        assert torch.equal(exported(ids).logits, reference(ids).logits)


def test_export_of_a_pipeline_checkpoint_loads_and_registers_with_its_stage_run(pipeline, tmp_path):
    from mlflow import MlflowClient
    from transformers import AutoModelForCausalLM

    checkpoint = pipeline / "pipeline-0001" / "cpt" / "checkpoints" / "step-000002"
    out = tmp_path / "cpt-export"
    proc = run_baton("ckpt", "export", str(checkpoint), str(out), "--register", "tiny-cpt", check=True)
    assert "lineage: pipeline run #1" in proc.stdout and "registered tiny-cpt version 1" in proc.stdout
    _logits_match(out, checkpoint, AutoModelForCausalLM)
    card = (out / "README.md").read_text()
    assert "stage **cpt**, step **2**" in card and "| pipeline run | #1 'baton' (completed) |" in card
    shown = json.loads(run_baton("lineage", "show", "--json", f"run.dir={pipeline}", check=True).stdout)
    [stage_run] = shown["stage_runs"]
    client = MlflowClient(tracking_uri=f"sqlite:///{pipeline / 'mlflow.db'}")
    version = client.get_model_version("tiny-cpt", "1")
    assert version.run_id == stage_run["mlflow_run_id"] and version.source == out.as_uri()
    assert version.tags["baton.stage"] == "cpt" and version.tags["baton.step"] == "2"


def test_export_of_a_zero3_checkpoint_gives_its_logits(home, sft_from_adopted, tmp_path):
    from transformers import AutoModelForCausalLM

    assert json.loads((sft_from_adopted / "manifest.json").read_text())["parallel"]["zero_stage"] == 3
    out = tmp_path / "sft-export"
    run_baton("ckpt", "export", str(sft_from_adopted), str(out), check=True)
    _logits_match(out, sft_from_adopted, AutoModelForCausalLM)
    card = (out / "README.md").read_text()
    assert "stage **sft**, step **1**" in card and "stage.init_from=" in card
    provenance = json.loads((out / "baton_export.json").read_text())
    assert provenance["content_digest"] == content_digest_of(sft_from_adopted)
    assert f"| content digest | `{provenance['content_digest']}` |" in card


def test_export_of_a_reward_model_uses_its_sequence_classification_class(home, adopted, tmp_path):
    from transformers import AutoModelForSequenceClassification

    run_baton("stage", "rm", f"stage.init_from={adopted[0]}", "stage.max_steps=1",
              "stage.save_every=1", "stage.eval_samples=4", f"run.dir={home}", check=True)
    checkpoint = home / "rm" / "checkpoints" / "step-000001"
    out = tmp_path / "rm-export"
    proc = run_baton("ckpt", "export", str(checkpoint), str(out), check=True)
    assert "(LlamaForSequenceClassification)" in proc.stdout
    _logits_match(out, checkpoint, AutoModelForSequenceClassification)


def test_export_refuses_a_directory_that_is_not_empty(adopted, tmp_path):
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "file").write_text("x")
    proc = run_baton("ckpt", "export", str(adopted[0]), str(tmp_path / "taken"))
    assert proc.returncode == 2 and "already exists and is not empty" in proc.stderr
