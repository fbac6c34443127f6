"""`--config FILE`: a YAML file of settings, read as overrides placed before the command
line's (so `key=value` on the command line wins).

The file mirrors `baton config`'s output: nested keys (`data: {sft: {train: {path: …}}}`)
or dotted ones (`data.sft.train.path: …`). Each leaf becomes one Hydra override, so a
file and a command line are checked by the same code and report errors the same way.
"""
from __future__ import annotations

from pathlib import Path

from core.config.compose import quoted_value
from core.errors import ConfigError


def file_overrides(path: str) -> list[str]:
    import yaml

    source = Path(path)
    try:
        loaded = yaml.safe_load(source.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError([f"--config {path}: cannot read it ({exc.strerror}); expected a YAML "
                           "file of settings, as `baton config` prints them"]) from None
    except yaml.YAMLError as exc:
        raise ConfigError([f"--config {path}: not valid YAML ({' '.join(str(exc).split())}); "
                           "expected nested keys as `baton config` prints them"]) from None
    if loaded is None:
        return []
    if not isinstance(loaded, dict):
        raise ConfigError([f"--config {path}: holds a {type(loaded).__name__}; expected a mapping "
                           "of settings (e.g. `data: {sft: {train: {path: chats.jsonl}}}`)"])
    return [f"{key}={_value(value)}" for key, value in _leaves(loaded, "")]


def _leaves(node: dict, prefix: str):
    for key, value in node.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            yield from _leaves(value, name + ".")
        else:
            yield name, value


def _value(value) -> str:
    """Hydra's override grammar: quoted strings, [lists], {dicts}, null, numbers, booleans."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, list):
        return "[" + ",".join(_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{_value(v)}" for k, v in value.items()) + "}"
    return quoted_value(value)
