"""Prefect flows: the pipeline, the handoff tasks, re-run. Wiring only."""
