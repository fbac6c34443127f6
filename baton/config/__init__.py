"""Configuration: typed schema (`schema`), Hydra composition (`compose`), checks (`validate`)."""
from baton.config.compose import compose, resolved_yaml, config_hash
from baton.config.schema import BatonConfig

__all__ = ["BatonConfig", "compose", "resolved_yaml", "config_hash"]
