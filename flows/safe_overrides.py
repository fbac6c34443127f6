"""The overrides a Prefect flow is called with, as Prefect may keep them.

Prefect stores every flow run's parameters in its database, and the flow recomposes
its config from them in each task. So the user's `store.url=…:password@…` must not
reach it: the URL keys are pinned to the values `compose` left (`***` in place of the
password, which is already in the environment the tasks inherit), and any other text
that looks like a URL with a password is masked too.
"""
from __future__ import annotations

from core.config.secrets import SECRET_KEYS, redact_text
from core.config.schema import BatonConfig
from core.config.compose import quoted


def safe_overrides(overrides: list[str], cfg: BatonConfig) -> list[str]:
    """`overrides` without secrets; `cfg` is what `compose(overrides)` returned."""
    kept: list[str] = []
    pinned: list[str] = []
    for override in overrides:
        key = override.split("=", 1)[0].lstrip("+~")
        if key in SECRET_KEYS and "=" in override:
            section, field = key.split(".")
            value = getattr(getattr(cfg, section), field)
            pinned = [p for p in pinned if not p.startswith(f"{key}=")]
            pinned.append(quoted(key, value) if value is not None else f"{key}=null")
        else:
            kept.append(redact_text(override))
    return kept + pinned
