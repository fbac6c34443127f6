"""Configuration: typed schema (`schema`), Hydra composition (`compose`), checks (`validate`)."""
from core.config.compose import compose, resolved_yaml, config_hash
from core.config.schema import BatonConfig

__all__ = ["BatonConfig", "compose", "resolved_yaml", "config_hash"]
