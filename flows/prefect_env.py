"""Prefect's environment for a run without a Prefect server.

Set before prefect is imported: the commands that start flows (`baton run`,
`baton rerun`) call it first, so each run's ephemeral API lives under its own run home.
"""
from __future__ import annotations


def embedded_prefect_env(run_dir: str) -> None:
    """Without a Prefect server, give the ephemeral API its own home under the run home:
    concurrent runs elsewhere on the machine never share (and lock) its SQLite file.
    Must run before prefect is imported."""
    import os
    from pathlib import Path

    if not os.environ.get("PREFECT_API_URL"):
        from flows.prefect_template import seed_database

        home = Path(os.environ.setdefault("PREFECT_HOME", str(Path(run_dir) / ".prefect")))
        home.mkdir(parents=True, exist_ok=True)
        seed_database(home)  # a migrated database: the server skips the migrations
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    # A fresh ephemeral database is migrated at start-up: slow on a busy 2-core machine.
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
