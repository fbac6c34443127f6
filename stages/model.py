"""The built-in tiny Llama model and loading of any local Hugging Face causal LM.

Every stage loads model + tokenizer from a directory; the built-in one is created
once per run home (random init from `conf/model/tiny.yaml` and the run seed).
"""
from __future__ import annotations

import fcntl
import json
from dataclasses import asdict
from pathlib import Path

from core.config.schema import BatonConfig, ModelConfig

BUILTIN_DIRNAME = "model"


def builtin_model_dir(cfg: BatonConfig) -> Path:
    return Path(cfg.run.dir) / BUILTIN_DIRNAME


def model_dir(cfg: BatonConfig) -> Path:
    return Path(cfg.model.path).resolve() if cfg.model.path else builtin_model_dir(cfg)


def ensure_model_dir(cfg: BatonConfig) -> Path:
    """Return the model directory, creating the built-in model there if needed."""
    directory = model_dir(cfg)
    if cfg.model.path is None and not (directory / "config.json").is_file():
        # Two stages started at once on a fresh run.dir (they hold different stage locks)
        # would both write `model.tmp`: the second waits here, then finds the model made.
        directory.parent.mkdir(parents=True, exist_ok=True)
        with open(directory.with_name(directory.name + ".lock"), "a") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            if not (directory / "config.json").is_file():
                _create_builtin_pinned(cfg, directory)
    return directory


def _create_builtin_pinned(cfg: BatonConfig, directory: Path) -> None:
    """The random initialisation runs ATen kernels, so it runs under `repro.mode`: in this
    process when it is pinned to that mode (a `baton` command pins itself first) and has
    its libraries loaded (a worker); else by a warm process of the fork server where there
    is one (stages.fork_server: torch and transformers are loaded there, ~4 s of CPU
    spared); else here when pinned; else in a child process that is. Never by re-pinning
    this one: its environment would leak into every process it starts later."""
    import os
    import sys

    from core.repro import apply_in_process, runs_pinned
    from stages.fork_server import ENV as FORK_SERVER

    warm = bool(os.environ.get(FORK_SERVER))
    # runs_pinned imports torch: asked where transformers (torch with it) is loaded already,
    # or where there is no warm process to ask instead.
    if ("transformers" in sys.modules or not warm) and runs_pinned(cfg.repro):
        apply_in_process(cfg.repro)  # threads and deterministic kernels (a repeat is harmless)
        create_builtin(cfg.model, cfg.seed, directory)
        return
    import subprocess

    from core import processes
    from stages.lifeline import ENV_CHAIN
    from stages.worker_env import worker_env
    command = ["stages.builtin_model", str(directory), json.dumps(asdict(cfg.model)),
               str(cfg.seed), json.dumps(asdict(cfg.repro))]
    if warm:  # as a one-process launch; the launch agent starts it cold if no warm process can
        command = ["stages.launch_agent", "--standalone", "--nproc-per-node=1",
                   "-m", "stages.lean_start", *command]
    # The chain (stages.lifeline): a warm maker dies with this process, as workers do.
    env = {**worker_env(cfg.repro), ENV_CHAIN: processes.current().token()}
    subprocess.run([sys.executable, "-m", *command], env=env, check=True, capture_output=True)


def create_builtin(spec: ModelConfig, seed: int, directory: Path) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from stages.tokenizer import build_char_tokenizer

    tokenizer = build_char_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size, num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads, num_key_value_heads=spec.num_key_value_heads,
        max_position_embeddings=spec.max_position_embeddings, tie_word_embeddings=False,
        pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    tmp = directory.with_name(directory.name + ".tmp")
    tmp.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(tmp), safe_serialization=True)
    tokenizer.save_pretrained(str(tmp))
    (tmp / "baton_model.json").write_text(json.dumps({"builtin": asdict(spec), "seed": seed}))
    tmp.rename(directory)  # a half-written model directory is never picked up


def load_model_and_tokenizer(directory: str | Path, model_class=None):
    """`model_class(config)` picks the class (default: the config's causal LM); a head the
    directory lacks (e.g. a reward model's `score`) is freshly initialised."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    quiet_transformers()
    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    cls = AutoModelForCausalLM if model_class is None else model_class(AutoConfig.from_pretrained(str(directory)))
    extra = {"num_labels": 1} if cls.__name__.endswith("ForSequenceClassification") else {}
    # eager attention: deterministic on CPU and identical across ranks.
    model = cls.from_pretrained(str(directory), attn_implementation="eager", **extra)
    return model, tokenizer


def quiet_transformers() -> None:
    """transformers' per-load reports (new head, dropped lm_head) repeat what baton already
    reports once, in its own words, through `load_weights_into`."""
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def model_identity(model, tokenizer) -> dict:
    """The config keys that must match between a checkpoint and the run loading it."""
    config = model.config.to_dict()
    keep = ("model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
            "num_attention_heads", "num_key_value_heads", "max_position_embeddings",
            "tie_word_embeddings", "rope_theta")
    identity = {k: config.get(k) for k in keep}
    # The class tells a reward model (scalar head) from a policy with the same backbone.
    identity["architecture"] = getattr(model, "architecture_name", None) or type(model).__name__
    identity["tokenizer.vocab_size"] = len(tokenizer)
    identity["tokenizer.class"] = type(tokenizer).__name__
    return identity


# Files whose bytes are weights: they never change a model's identity, and hashing them
# would cost what the digest below exists to save.
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".gguf")
IDENTITY_LIBRARIES = ("transformers", "tokenizers")


def model_files_digest(directory: str | Path) -> str:
    """What `model_identity_from_dir` reads, as a digest: the directory's files other than
    weights (config, tokenizer, any code) and the versions of the libraries that read them.
    Equal digests give equal identities, so a resume can skip computing one (ckpt.compat)."""
    import hashlib
    from importlib.metadata import PackageNotFoundError, version

    hasher = hashlib.sha256()
    for name in IDENTITY_LIBRARIES:
        try:
            hasher.update(f"{name}=={version(name)}\n".encode())
        except PackageNotFoundError:
            hasher.update(f"{name} absent\n".encode())
    for path in sorted(Path(directory).iterdir()):
        if path.is_file() and not path.name.endswith(WEIGHT_SUFFIXES):
            hasher.update(f"{path.name}\n{path.stat().st_size}\n".encode())
            hasher.update(path.read_bytes())
    return "mf1:" + hasher.hexdigest()


def model_identity_from_dir(directory: str | Path, model_class) -> dict:
    """`model_identity` of the model a stage trains, without loading weights (used before
    workers start). `model_class`: the stage's objective's `model_class` (stages.registry)."""
    from transformers import AutoConfig, AutoTokenizer

    class _Shell:
        config = AutoConfig.from_pretrained(str(directory))
        architecture_name = model_class(config).__name__

    return model_identity(_Shell, AutoTokenizer.from_pretrained(str(directory)))
