"""Compose `conf/pipeline.yaml` with Hydra and return a validated, typed config.

Hydra stops at the first bad override; users want to see every mistake at once, so
each override is first tried on its own and all failures are collected.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from core.config import secrets, validate
from core.config.schema import BatonConfig
from core.errors import ConfigError

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"
SCHEMA_NAME = "baton_schema"


def _register_schema() -> None:
    ConfigStore.instance().store(name=SCHEMA_NAME, node=BatonConfig)


def _compose_raw(overrides: list[str], config_name: str):
    _register_schema()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return hydra_compose(config_name=config_name, overrides=overrides)


def _describe(override: str, exc: Exception) -> str:
    cause = exc.__cause__ or exc.__context__
    text = " ".join(str(exc).split())
    if cause is not None:
        # Hydra wraps OmegaConf's precise message ("Value 'two' of type 'str' could not be
        # converted to Integer ... full_key: parallel.world_size") in a generic one.
        text = " ".join(str(cause).split())
    key = override.split("=", 1)[0].lstrip("+~")
    if "Could not override" in text or "not in struct" in text or "Key '" in text and "not" in text:
        return (f"{override!r}: unknown config key '{key}' ({text}); "
                "run `baton config` to list valid keys")
    return f"{override!r}: {text}"


def _sort_overrides(overrides: list[str], config_name: str) -> tuple[list[str], list[str]]:
    """(the overrides that compose on their own, a problem line for each that does not)."""
    good, bad = [], []
    for override in overrides:
        try:
            _compose_raw([override], config_name)
            good.append(override)
        except Exception as exc:
            bad.append(secrets.redact_text(_describe(override, exc)))
    return good, bad


def compose(overrides: list[str] | tuple[str, ...] = (), config_name: str = "pipeline") -> BatonConfig:
    """Compose, type-check and validate; raise ConfigError listing every problem."""
    found: list[str] = []
    good: list[str] = []
    for override in overrides:
        if "=" in override:
            good.append(override)
        else:
            problem = f"{override!r}: expected key=value (e.g. parallel.world_size=2)"
            found.append(secrets.redact_text(problem))
    try:
        raw = _compose_raw(good, config_name)
    except Exception:  # Hydra/OmegaConf raise several unrelated types
        # Only now one override at a time (a compose is 0.3-0.6 s of CPU, and the CLI and
        # every stage of a pipeline compose): every bad one is named, not just the first.
        good, bad = _sort_overrides(good, config_name)
        found += bad
        raw = _compose_raw(good, config_name)
    # The remaining checks run on the overrides that did parse, so one run reports
    # both kinds of mistake.
    cfg: BatonConfig = OmegaConf.to_object(raw)
    if not str(cfg.run.dir).strip():
        # Path("").resolve() is the current directory: never a run home by accident.
        found.append("run.dir='': expected a directory for the run home (e.g. run.dir=runs/try1)")
        cfg.run.dir = "runs/default"
    cfg.run.dir = str(Path(cfg.run.dir).expanduser().resolve())
    absolute_input_paths(cfg)
    # First, before anything can print or persist the config: passwords go to the
    # environment, the URLs keep `***` (and so does the config hash).
    found += secrets.move_to_environment(cfg)
    if cfg.rl.reward.rm_weight is not None:  # the name RL-on-your-data users look for
        cfg.stage.reward_model_weight = cfg.rl.reward.rm_weight
    found += validate.problems(cfg)
    if found:
        raise ConfigError(found)
    return cfg


def absolute_input_paths(cfg: BatonConfig) -> None:
    """Your data, chat template and reward files, as absolute paths: stages and Prefect
    workers run in other directories than the command that named them. A glob stays a
    glob (only made absolute)."""
    import os

    def absolute(value):
        return os.path.abspath(os.path.expanduser(value)) if value and "://" not in value else value

    for stage in ("cpt", "sft", "rm", "rl"):
        section = getattr(cfg.data, stage)
        section.train.path, section.eval.path = absolute(section.train.path), absolute(section.eval.path)
    cfg.data.cache_dir = absolute(cfg.data.cache_dir)
    for function in cfg.rl.reward.functions:
        function.path = absolute(function.path)
    template = cfg.model.chat_template
    if template and "{" not in template and Path(template).expanduser().is_file():
        cfg.model.chat_template = absolute(template)  # a file, not an inline template


def as_dict(cfg: BatonConfig) -> dict:
    return OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True)


def from_dict(data: dict) -> BatonConfig:
    merged = OmegaConf.merge(OmegaConf.structured(BatonConfig), data)
    return OmegaConf.to_object(merged)


def resolved_yaml(cfg: BatonConfig) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def config_hash(cfg: BatonConfig) -> str:
    """sha256 of the canonical JSON of the resolved config (what a re-run must match)."""
    canonical = json.dumps(as_dict(cfg), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


# Where a run writes and records, and whether it resumes: not what it computes.
LOCATION_KEYS = ("run", "resume", "store", "mlflow")


def training_config_hash(cfg: BatonConfig) -> str:
    """sha256 of the config without LOCATION_KEYS: equal for a re-run in another run
    directory, so a fingerprint difference in it means the computation changed."""
    training = {k: v for k, v in as_dict(cfg).items() if k not in LOCATION_KEYS}
    canonical = json.dumps(training, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def quoted(key: str, value) -> str:
    """An override whose value may hold ':' '/' '@' (paths, URLs)."""
    return f"{key}={quoted_value(value)}"


def quoted_value(value) -> str:
    """A string in Hydra's override grammar. Hydra unescapes a backslash only before a
    quote (or the closing one): those are doubled, any other (a template's '\\n') stays."""
    import re
    text = re.sub(r"(\\+)(?='|$)", lambda m: m.group(1) * 2, str(value)).replace("'", "\\'")
    return f"'{text}'"
