"""Checkpoint tiers: copies in node memory, on a peer's keeper and at a URL (docs/tiers.md)."""
