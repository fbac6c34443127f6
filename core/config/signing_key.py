"""Whether `ckpt.signing_key_env` can name the checkpoint signing key.

A config check (run when the config is composed, and again by ckpt.signing when a
process turns signing on): the variable's name is checked and its value only tested
for presence, never read into a message.
"""
from __future__ import annotations

import os
import re

CONFIG_KEY = "ckpt.signing_key_env"
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def key_problems(env_name: str | None) -> list[str]:
    """Why `env_name` cannot serve as the signing key's variable (empty list: it can)."""
    if env_name is None:
        return []
    if not _ENV_NAME.match(env_name):
        return [f"{CONFIG_KEY}={env_name!r}: expected the name of an environment variable "
                "(letters, digits, '_'), not the key itself"]
    if not os.environ.get(env_name):
        return [f"{CONFIG_KEY}={env_name}: the environment variable {env_name} is not set or "
                f"is empty. Export the HMAC key in it (e.g. `export {env_name}=$(openssl rand "
                f"-hex 32)`, kept as secret as write access to the checkpoints), or drop "
                f"{CONFIG_KEY} to work without signatures"]
    return []
