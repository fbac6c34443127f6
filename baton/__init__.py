"""baton: multi-stage LLM post-training with recorded, reproducible stage handoffs."""

__version__ = "0.1.0"
