"""Optional manifest signatures: HMAC-SHA256 with a key taken from the environment.

`ckpt.signing_key_env=NAME` names the environment variable holding the key. With it,
every manifest this process writes is signed, and `manifest.read` refuses one that is
unsigned or whose signature does not match, before any other byte of the checkpoint is
read. Without it, signatures are neither written nor checked. The key is read from the
environment each time it is needed and is never stored, logged or written; the config
(and so every record of it) holds only the variable's name.

The signature covers the canonical JSON of the whole manifest except the `signature`
field itself: every file's size and sha256, the components, stage, step and layout.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import os

from core.config.signing_key import CONFIG_KEY, key_problems
from core.errors import ConfigError

ALG = "hmac-sha256"
FIELD = "signature"

_key_env: str | None = None  # set by configure(); the variable's name, never its value


def configure(env_name: str | None) -> None:
    """Turn signing on for this process (None turns it off); ConfigError if the variable
    is unset. Workers call it with their config's value; the variable is inherited."""
    global _key_env
    problems = key_problems(env_name or None)
    if problems:
        raise ConfigError(problems)
    _key_env = env_name or None


def key_env() -> str | None:
    return _key_env


def _key() -> bytes:
    value = os.environ.get(_key_env or "", "")
    if not value:  # unset after configure(): refuse rather than sign with nothing
        raise ConfigError(key_problems(_key_env))
    return value.encode()


def canonical(data: dict) -> bytes:
    """What is signed: sorted, compact JSON of the manifest without its signature. The JSON
    round trip first makes a freshly built manifest and a parsed one byte-identical."""
    body = json.loads(json.dumps({k: v for k, v in data.items() if k != FIELD}))
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def _digest(data: dict, key: bytes) -> str:
    return hmac.new(key, canonical(data), hashlib.sha256).hexdigest()


def signature_for(data: dict) -> dict | None:
    """The signature field for a manifest about to be written (None: signing is off)."""
    if _key_env is None:
        return None
    return {"alg": ALG, "value": _digest(data, _key())}


def check(directory, data: dict) -> None:
    """Refuse a manifest not signed with the configured key (no-op when signing is off)."""
    from ckpt.errors import BadSignature

    if _key_env is None:
        return
    found = data.get(FIELD)
    if not isinstance(found, dict) or not found.get("value"):
        raise BadSignature(directory, _key_env, "is not signed")
    if found.get("alg") != ALG:
        raise BadSignature(directory, _key_env, f"is signed with {found.get('alg')!r}, not {ALG}")
    if not hmac.compare_digest(str(found["value"]), _digest(data, _key())):
        raise BadSignature(directory, _key_env, "has a signature that does not match its "
                           "content (it was changed after signing, or signed with another key)")


def split_override(overrides: list[str]) -> tuple[str | None, list[str]]:
    """Take `ckpt.signing_key_env=NAME` out of CLI overrides: (NAME or None, the rest)."""
    name, rest = None, []
    for item in overrides:
        key, _, value = item.partition("=")
        if key.lstrip("+") == CONFIG_KEY:
            name = None if value.strip() in ("", "null", "~") else value.strip()
        else:
            rest.append(item)
    return name, rest
